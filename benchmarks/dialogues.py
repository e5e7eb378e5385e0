"""Long multi-session dialogues with annotated evidence: the data of ``bench_recall.py``.

:func:`generate` builds, deterministically from a seed, a corpus of *dialogues*: two or
three people who talk in dated *sessions* (days to weeks apart, 14-26 turns each). Most
turns are chit-chat of everyday length (typically 100-200 characters) drawn from a large
pool of sentence templates with varied slots. Planted among them are *facts*, told the way
people tell them: across several turns, with one person's question confirmed by the
other ("Wait, the beagle with the floppy ears?" / "Yes! That's the one I told you about.
We named him Biscuit."), continued in a later session ("I got it! I start there next
month."), or only implied ("my throat closes up if I eat even one").

Each fact comes with questions whose *evidence turns* are annotated. The question kinds:

* ``single``: one turn answers it.
* ``reference``: the answer lies in two neighbouring turns, one of which means little on
  its own ("Yes! That's the one I told you about").
* ``multi``: two or three turns from different sessions together answer it.
* ``temporal``: a date: "when did ...", or a question bounded to a month ("What broke on
  Maya's car in July 2023?") where the same kind of event also happened at other times.
* ``inference``: the evidence implies the answer without stating it.
* ``identifier``: a lookup by a code the turn holds (a tracking number, a booking
  reference, a case number, a model number), often with little else in the question
  ("What was QX-7781 about?"): the words around the code rarely match, the code always
  does, and the same kind of turn with other codes recurs in every dialogue.

Questions paraphrase the evidence and never copy it: the only words they share with it are
names and the occasional topic word. Every dialogue has other people and values, so at
scale the same kinds of facts recur about other people: a question is answered only by the
right person's turns. People are named in the questions; the turns' speaker is the
message's ``name`` (as in a real chat log), not part of its text.

The corpus of ``n`` messages is the first dialogues of one endless sequence (a larger
corpus contains every smaller one), with all turns ordered by time, so dialogues interleave
as they would in one shared memory. Questions are asked about the first
``question_dialogues`` dialogues only, so every size asks the same questions and the sizes
differ only in how much there is to search. Each fact template belongs to the ``train`` or
the ``test`` split (alternating within each kind), so weights tuned on the train questions
are judged on questions of other templates.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

__all__ = ["KINDS", "Corpus", "Question", "Turn", "generate"]

KINDS = ("single", "reference", "multi", "temporal", "inference", "identifier")


@dataclass(frozen=True)
class Turn:
    """One message of a dialogue."""

    id: str
    dialogue: int
    session: int
    speaker: str
    text: str
    timestamp: datetime


@dataclass(frozen=True)
class Question:
    """A question, its kind, its split and the ids of the turns that answer it."""

    id: str
    text: str
    kind: str
    evidence: tuple[str, ...]
    split: str
    template: str
    answer: str


@dataclass
class Corpus:
    """The turns (ordered by time) and the questions."""

    turns: list[Turn]
    questions: list[Question]
    dialogues: int = 0
    meta: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------- vocabulary
FIRST = """Maya Jonas Priya Tomasz Aiko Fatima Lucia Mateo Ingrid Kwame Sofia Dmitri Elena
Rahul Hannah Omar Chloe Yusuf Greta Luca Amara Felix Nadia Oscar Leila Hugo Mira Tariq Ines
Viktor Zara Emil Noor Bruno Freya Diego Anya Kofi Lena Rafael Yara Stefan Idris Alma Pedro
Saanvi Anton Beatrix Cyrus Dalia Ezra Farah Gideon Hedda Ivo Jana Kenji Lotte Malik Nina
Otto Paloma Quentin Rosa Samir Thea Umar Vera Wim Xenia Yosef Zoe Arjun Bianca Cosmo Daria
Elias Fiona Gustav Hina Isak Juno Kaia Levi Magnus Nell Orla Pia Ravi Selma Teo Ulla
Valentin Wanda Yuki Agnes Basil Cleo Dario Edith Flora Gael Hector Iris Joel Klara Luis
Milo Nora Oskar Petra Rhea Silas Tilde Uri Vida Wes Ximena Yann Zeno Adele Boris Celia
Dante Elsa Frida Goran Heidi Ilse Jasper Kira Lars Marta Nils Odile Paolo Rania Sven Tess
Ugo Veda Walt Yvonne Zofia""".split()
KIDS = """Lily Sam Noah Ava Leo Mia Finn Ella Max Ruby Theo Isla Jack Rosie Ben Evie Kai
Nora Otis Ivy""".split()
CITIES = """Lisbon Oslo Nairobi Kyoto Toronto Lima Tallinn Porto Krakow Seville Dublin Utrecht
Montreal Hanoi Cordoba Bergen Adelaide Valparaiso Ljubljana Tbilisi Marrakesh Quito Gdansk
Bilbao Zagreb Riga Vilnius Accra Bologna Lyon Leipzig Gothenburg Aarhus Cusco Medellin
Penang Busan Hobart Tromso Salzburg Bruges Ghent Graz Turin Naples Malaga Split""".split()
BREEDS = [
    "beagle",
    "corgi",
    "greyhound",
    "border collie",
    "dachshund",
    "husky",
    "poodle mix",
    "whippet",
    "shiba inu",
    "labrador",
]
PETS = """Biscuit Pickles Mochi Pepper Noodle Waffles Clover Ziggy Tofu Maple Pumpkin Bean
Sprout Nacho Olive Gizmo Pretzel Juniper Rolo Miso""".split()
CATS = """Luna Socks Smokey Tiger Ginger Shadow Mittens Figaro Salem Willow""".split()
FOODS = [
    "peanuts",
    "shellfish",
    "sesame",
    "kiwi",
    "strawberries",
    "walnuts",
    "mango",
    "cashews",
    "shrimp",
    "hazelnuts",
]
JOBS = [
    "pharmacist",
    "architect",
    "paramedic",
    "translator",
    "geologist",
    "data analyst",
    "veterinary nurse",
    "project manager",
    "sound engineer",
    "landscape designer",
]
COMPANIES = [
    "Northwind",
    "Brightline",
    "Kestrel Labs",
    "Harbor & Co",
    "Bluefin Health",
    "Verdant",
    "Lumen Studios",
    "Oakridge",
    "Pioneer Freight",
    "Solstice Games",
]
LANGUAGES = [
    "Portuguese",
    "Japanese",
    "Swahili",
    "Finnish",
    "Turkish",
    "Korean",
    "Polish",
    "Dutch",
    "Greek",
    "Hindi",
]
BANDS = [
    "Radiohead",
    "Fleetwood Mac",
    "Daft Punk",
    "Khruangbin",
    "The Cure",
    "Massive Attack",
    "Arctic Monkeys",
    "Bon Iver",
    "Florence and the Machine",
    "Tame Impala",
]
AUTHORS = [
    "Ursula Le Guin",
    "Toni Morrison",
    "Kazuo Ishiguro",
    "Octavia Butler",
    "Haruki Murakami",
    "Zadie Smith",
    "Cormac McCarthy",
    "Elena Ferrante",
    "Chimamanda Adichie",
    "Italo Calvino",
]
INSTRUMENTS = ["cello", "violin", "piano", "clarinet", "flute", "trumpet", "harp", "drums"]
CAR_PARTS = [
    ("alternator", "the battery light kept flickering"),
    ("timing belt", "it made a horrible screeching noise"),
    ("radiator", "steam was pouring out of the hood"),
    ("starter motor", "it just clicked when I turned the key"),
    ("fuel pump", "it sputtered and died at a red light"),
    ("clutch", "the pedal went straight to the floor"),
]
CARS = ["old Volvo", "Corolla", "little Fiat", "van", "Golf", "Subaru", "hatchback"]
GIFTS = [
    "a pottery class for two",
    "a vintage record player",
    "a weekend in a treehouse",
    "a telescope",
    "a hand-made quilt",
    "a cast iron pan",
    "a hot air balloon ride",
]
HOBBIES = [
    ("bouldering", "climbing gym", "chalk and new climbing shoes"),
    ("trail running", "hills", "trail shoes and a running vest"),
    ("sea kayaking", "bay", "a paddle and a dry bag"),
    ("birdwatching", "marshes", "binoculars and a field guide"),
    ("woodworking", "garage", "chisels and clamps"),
    ("open water swimming", "lake", "a wetsuit and goggles"),
]
VOLUNTEER = [
    "food bank",
    "animal shelter",
    "community garden",
    "library reading club",
    "soup kitchen",
    "youth football club",
]
NEIGHBOURHOODS = [
    "Riverside",
    "Old Town",
    "the harbour district",
    "Hillcrest",
    "Northgate",
    "Eastfield",
    "the university quarter",
    "Greenhill",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
# chit-chat vocabulary
DISHES = [
    "lentil soup",
    "pad thai",
    "a mushroom risotto",
    "tacos",
    "a big pot of chili",
    "banana bread",
    "dumplings",
    "shakshuka",
    "lasagna",
    "ramen",
    "a curry",
    "pancakes",
]
SHOWS = [
    "that baking competition",
    "the new detective series",
    "a documentary about octopuses",
    "an old sitcom",
    "the cooking show with the grumpy chef",
    "a nature series",
    "that Korean drama",
    "the football highlights",
    "a true crime podcast",
]
CHORES = [
    "laundry",
    "the dishes",
    "fixing the leaky tap",
    "cleaning out the fridge",
    "sorting the recycling",
    "vacuuming",
    "ironing shirts",
    "repotting plants",
]
WEATHER = [
    "raining nonstop",
    "weirdly warm",
    "freezing",
    "grey and windy",
    "sunny but cold",
    "so humid",
    "foggy all morning",
    "stormy",
]
PLACES = [
    "the farmers market",
    "the bakery on the corner",
    "the park",
    "the library",
    "my aunt's place",
    "the hardware store",
    "the new cafe downtown",
    "the gym",
    "the dentist",
    "the post office",
    "the cinema",
    "the swimming pool",
]
FEELINGS = [
    "exhausted",
    "pretty good actually",
    "a bit scattered",
    "weirdly energetic",
    "sleepy",
    "stressed but okay",
    "relaxed for once",
    "restless",
]
THINGS = [
    "phone charger",
    "umbrella",
    "reading glasses",
    "keys",
    "water bottle",
    "headphones",
    "wallet",
    "library card",
]
COLLEAGUES = [
    "my manager",
    "a coworker",
    "the new intern",
    "our team lead",
    "the client",
    "someone from accounting",
    "my neighbour",
    "my cousin",
]

FILLER_A = [
    "Work has been hectic this week, {colleague} moved every deadline forward and I "
    "basically lived on coffee until {weekday}.",
    "It's been {weather} here all week, so I mostly stayed in and watched {show}.",
    "I finally got around to {chore} today, which felt like a bigger win than it should.",
    "Made {dish} for dinner last night and there are leftovers for days, honestly too many.",
    "Went to {place} this morning and ran into {colleague}, we ended up chatting for an hour.",
    "I'm feeling {feeling} today, not sure why. Maybe it's the weather, it's {weather}.",
    "Lost my {thing} again. Third time this month. I'm starting to think the house eats them.",
    "Have you watched {show}? I started it on {weekday} and somehow finished the whole season.",
    "My plan for the weekend is absolutely nothing. Maybe {chore} if I feel ambitious.",
    "Tried a new recipe for {dish}, it came out okay but I think I used way too much garlic.",
    "{colleague_cap} asked me to cover a shift on {weekday}, so my lazy morning is cancelled.",
    "The bus was late again so I walked, and of course it started {weather_short} halfway.",
    "I spent way too long at {place} today, they rearranged everything and I got lost.",
    "Quick question, do you still have that recipe for {dish}? I want to make it on {weekday}.",
    "Ugh, {colleague} scheduled a meeting at eight in the morning. Who does that on a {weekday}?",
    "Finally cleaned my desk and found my {thing} under a stack of old receipts.",
    "We had a power cut for two hours last night, so we played cards by candlelight.",
    "I've been sleeping so badly lately, I keep waking up at four and scrolling my phone.",
    "Thinking of repainting the living room, maybe a soft green. Or I'll just keep thinking.",
    "The neighbours are renovating again, the drilling starts at seven every single morning.",
    "I signed up for a pottery taster session on {weekday}, probably just to get out of the house.",
    "Spent the afternoon at {place} because the wifi at home died again, so annoying.",
    "Do you ever feel like a week lasts a month? This one has felt like that for me.",
    "I ordered groceries online and they sent me twelve lemons instead of two. Lemonade time.",
    "My phone screen cracked this morning, right across the middle, so now everything looks split.",
    "Watched {show} with my parents, they kept asking who everyone was the whole time.",
    "It's so {weather_short} today that I wore two jumpers inside and still felt it.",
    "I'm trying to drink more water this month. Day three and I already forgot twice.",
]
FILLER_B = [
    "Ha, that sounds about right. I'm {feeling} myself, it's been one of those weeks.",
    "Oh no, that's rough. Hope you get a proper rest soon, you deserve one.",
    "Honestly same. I keep telling myself I'll sort my life out next week.",
    "That's hilarious. You should write these things down, you'd have a book by now.",
    "Nice! I'm jealous, my week has been mostly {chore} and answering emails.",
    "Sounds cozy. It's been {weather} here too, so I've been hiding under a blanket.",
    "Oh I love {dish}! You'll have to make it for me next time I'm over.",
    "Ugh, I know that feeling. Did you at least get something good to eat afterwards?",
    "Wait, really? That's so random. What did you end up doing instead?",
    "Haha, classic. I did something similar with my {thing} last month.",
    "Not yet, but it's on my list. Is it worth it? I've heard mixed things.",
    "Good for you! I keep meaning to do that and never quite get there.",
    "That's so annoying. I'd have lost my patience completely, you're a saint.",
    "Ooh, tell me more later, I'm about to jump on a call but I want the full story.",
    "Honestly that sounds like a perfect weekend to me. No plans is the best plan.",
    "Yikes. Hope {colleague} at least bought everyone coffee for that.",
    "Oh, I went to {place} on {weekday} too! Funny we didn't bump into each other.",
    "Ha! Last time I tried that I ended up ordering pizza. Respect.",
    "Aw, that's sweet. Little moments like that make the whole week better.",
    "I feel that. My brain has been mush since Monday, nothing sticks.",
]
TAILS_A = [
    "Anyway, how's your week going?",
    "Not the most exciting news, I know.",
    "I'll tell you the whole saga when we see each other.",
    "Remind me to never do that again.",
    "The dog next door barked through all of it, of course.",
    "Also the car needs new tyres before winter, just to add to the list.",
    "I might treat myself to a takeaway tonight to recover.",
    "My sister says I'm being dramatic, but she wasn't there.",
    "On the bright side, I finished a whole book on the train.",
    "Honestly I'm just glad the week is almost over.",
    "I keep thinking about booking a trip somewhere warm.",
    "Mum called twice to ask about it, so now everyone knows.",
]
TAILS_B = [
    "What are you up to this weekend?",
    "Let me know if you need anything.",
    "We should get lunch soon, it's been ages.",
    "Did I tell you my cousin got a puppy? It chews everything.",
    "I've been trying to read more before bed, with mixed results.",
    "My car made a funny noise this morning too, it must be the cold.",
    "Send me a picture later!",
    "I'm so behind on everything, it's not even funny.",
    "Also, are we still on for Thursday?",
    "My flatmate has started learning the guitar, so my evenings are loud now.",
]
OPENERS = [
    "Hey {other}! How was your {weekday}?",
    "Hi {other}, long time! What have you been up to since we last talked?",
    "Morning {other}! Did you survive the week?",
    "Hey, got a minute? I've been meaning to message you all day.",
    "{other}! Sorry I went quiet, it's been chaos here. How are things?",
]
REPLIES = [
    "Hey! All good here, just {feeling}. What about you?",
    "Hi! Busy but fine. I was literally about to text you.",
    "Ha, barely. It was {weather} all week. Tell me everything.",
    "Hey you! Surviving, mostly. What's new with you?",
]
CLOSERS = [
    "Anyway, I should go make dinner. Talk soon!",
    "Okay I have to run, but this was nice. Speak later!",
    "Gotta go, {colleague} is calling. Catch up properly next week?",
    "Right, bedtime for me. Night!",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _fill(rng: random.Random, template: str, other: str) -> str:
    colleague = rng.choice(COLLEAGUES)
    weather = rng.choice(WEATHER)
    return template.format(
        colleague=colleague,
        colleague_cap=_cap(colleague),
        weekday=rng.choice(WEEKDAYS),
        weather=weather,
        weather_short=rng.choice(["cold", "hot", "windy", "rainy", "chilly"]),
        show=rng.choice(SHOWS),
        chore=rng.choice(CHORES),
        dish=rng.choice(DISHES),
        place=rng.choice(PLACES),
        feeling=rng.choice(FEELINGS),
        thing=rng.choice(THINGS),
        other=other,
    )


# ---------------------------------------------------------------------- facts
Line = tuple[int, str]  # (speaker: 0 owner / 1 partner, text)


@dataclass
class Scene:
    """Turns to plant in one session; ``mark`` names turns that questions point at."""

    lines: list[Line]
    marks: dict[str, int] = field(default_factory=dict)


@dataclass
class Fact:
    """A fact told in one or more scenes (each in its own session, in order)."""

    template: str
    scenes: list[Scene]
    # (kind, question, evidence marks as "scene.mark", answer)
    questions: list[tuple[str, str, tuple[str, ...], str]]


Maker = Callable[[random.Random, str, str], Fact]


def _pet(rng: random.Random, o: str, p: str) -> Fact:
    breed, pet = rng.choice(BREEDS), rng.choice(PETS)
    day = rng.choice(WEEKDAYS)
    s = Scene(
        [
            (
                0,
                f"Guess where we went on {day}! The shelter out by the ring road. I think "
                "I'm in love, we filled in all the forms on the spot.",
            ),
            (
                1,
                f"Wait, was it the {breed} with the floppy ears from the photo you sent me? "
                "Tell me you didn't leave without him.",
            ),
            (
                0,
                f"Yes! That's the one I told you about. We named him {pet}, and he's "
                "already asleep on my favourite jumper.",
            ),
        ],
        {"trip": 0, "breed": 1, "name": 2},
    )
    return Fact(
        "pet",
        [s],
        [
            ("reference", f"What breed is the dog {o} adopted?", ("0.breed", "0.name"), breed),
            ("single", f"What did {o} call the new puppy?", ("0.name",), pet),
            ("temporal", f"When did {o} get a dog from the animal rescue?", ("0.trip",), "date"),
        ],
    )


def _sibling(rng: random.Random, o: str, p: str) -> Fact:
    sib, city = rng.choice(FIRST), rng.choice(CITIES)
    role = rng.choice(["brother", "sister"])
    s = Scene(
        [
            (
                0,
                f"Big family news: my {role} {sib} packed up everything and relocated to "
                f"{city} for a job at the port. Mum is not coping.",
            ),
            (1, f"{city}? That's so far! Good for {sib} though, that's brave."),
        ],
        {"fact": 0, "echo": 1},
    )
    return Fact(
        "sibling",
        [s],
        [("single", f"In which city does {o}'s {role} live now?", ("0.fact",), city)],
    )


def _job(rng: random.Random, o: str, p: str) -> Fact:
    company, job = rng.choice(COMPANIES), rng.choice(JOBS)
    s1 = Scene(
        [
            (
                0,
                f"Had my second interview at {company} this morning. Three people on the "
                "panel, one of them didn't smile once. Fingers crossed.",
            ),
            (1, "You'll be fine, you always undersell yourself. When do they decide?"),
        ],
        {"interview": 0},
    )
    s2 = Scene(
        [
            (1, "Any news from that interview? I've been dying to ask."),
            (
                0,
                f"I got it!! Starting as their new {job} on the first of next month. "
                "Still can't quite believe it.",
            ),
        ],
        {"ask": 0, "offer": 1},
    )
    return Fact(
        "job",
        [s1, s2],
        [
            (
                "multi",
                f"Which company hired {o}, and for what position?",
                ("0.interview", "1.offer"),
                f"{company}, {job}",
            ),
            ("temporal", f"When was {o}'s job interview?", ("0.interview",), "date"),
            ("temporal", f"What career news did {o} share in {{month2}}?", ("1.offer",), job),
        ],
    )


def _allergy(rng: random.Random, o: str, p: str) -> Fact:
    food, dish = rng.choice(FOODS), rng.choice(DISHES)
    s = Scene(
        [
            (1, f"I'm making {dish} for the potluck, anything I should leave out for you?"),
            (
                0,
                f"Just keep the {food} away from me, please. Last time my throat swelled up "
                "and I spent the night in the emergency room.",
            ),
        ],
        {"ask": 0, "fact": 1},
    )
    return Fact(
        "allergy",
        [s],
        [("inference", f"What ingredient could make {o} seriously ill?", ("0.fact",), food)],
    )


def _hobby(rng: random.Random, o: str, p: str) -> Fact:
    hobby, where, gear = rng.choice(HOBBIES)
    s1 = Scene(
        [
            (
                0,
                f"I've been {hobby} every weekend since spring. My arms are sore all the "
                "time but I'm weirdly obsessed.",
            )
        ],
        {"fact": 0},
    )
    s2 = Scene(
        [
            (1, "What do you want for your birthday this year? And don't say nothing."),
            (
                0,
                f"Honestly? My {gear.split(' and ')[0]} is falling apart, so anything for "
                f"the {where} would make me happy.",
            ),
        ],
        {"ask": 0, "gear": 1},
    )
    return Fact(
        "hobby",
        [s1, s2],
        [
            (
                "inference",
                f"What sort of present would {o} appreciate most?",
                ("0.fact", "1.gear"),
                gear,
            ),
        ],
    )


def _trip(rng: random.Random, o: str, p: str) -> Fact:
    city = rng.choice(CITIES)
    s1 = Scene(
        [
            (
                0,
                f"We booked the flights to {city}! Ten days, no laptop, I've already made a "
                "list of every bakery I want to try.",
            )
        ],
        {"plan": 0},
    )
    s2 = Scene(
        [
            (1, f"You're back! How was {city}?"),
            (
                0,
                "Amazing food, terrible sunburn. I fell asleep on the beach on day two and "
                "looked like a lobster for the rest of the week.",
            ),
        ],
        {"ask": 0, "report": 1},
    )
    return Fact(
        "trip",
        [s1, s2],
        [
            (
                "reference",
                f"What went wrong for {o} on the holiday in {city}?",
                ("1.ask", "1.report"),
                "sunburn",
            ),
            ("temporal", f"When did {o} book the holiday to {city}?", ("0.plan",), "date"),
        ],
    )


def _book(rng: random.Random, o: str, p: str) -> Fact:
    author = rng.choice(AUTHORS)
    s = Scene(
        [
            (
                1,
                f"Did you ever finish that {author} novel I lent you? No pressure, I just "
                "miss it a little.",
            ),
            (
                0,
                "Finally, last night! The ending completely wrecked me, I was crying on the "
                "sofa at one in the morning.",
            ),
        ],
        {"ask": 0, "done": 1},
    )
    return Fact(
        "book",
        [s],
        [("reference", f"Whose book moved {o} to tears?", ("0.ask", "0.done"), author)],
    )


def _car(rng: random.Random, o: str, p: str) -> Fact:
    (part1, sign1), (part2, sign2) = rng.sample(CAR_PARTS, 2)
    car = rng.choice(CARS)
    s1 = Scene(
        [
            (
                0,
                f"The {car} died on the motorway again, {sign1}. Mechanic says it's the "
                f"{part1}, which is apparently not cheap.",
            ),
            (1, "Oh no, not again! Were you stuck there for long?"),
        ],
        {"first": 0},
    )
    s2 = Scene(
        [
            (
                0,
                f"You won't believe it, the {car} is back in the garage. This time {sign2}, "
                f"and now it's the {part2}. I'm naming it the money pit.",
            )
        ],
        {"second": 0},
    )
    return Fact(
        "car",
        [s1, s2],
        [
            (
                "multi",
                f"Which repairs has {o}'s vehicle needed?",
                ("0.first", "1.second"),
                f"{part1}, {part2}",
            ),
            ("temporal", f"What broke on {o}'s vehicle in {{month1}}?", ("0.first",), part1),
        ],
    )


def _recital(rng: random.Random, o: str, p: str) -> Fact:
    kid, inst = rng.choice(KIDS), rng.choice(INSTRUMENTS)
    day = rng.choice(WEEKDAYS)
    s = Scene(
        [
            (
                0,
                f"{kid}'s first {inst} recital was on {day}, and not one wrong note from "
                "start to finish. I cried, obviously. So did grandma.",
            ),
            (1, f"Aww, tell {kid} I said congratulations! That's a huge deal."),
        ],
        {"fact": 0},
    )
    return Fact(
        "recital",
        [s],
        [
            ("single", f"Which instrument does {o}'s daughter play?", ("0.fact",), inst),
            (
                "temporal",
                f"When did {kid} perform on stage for the first time?",
                ("0.fact",),
                "date",
            ),
        ],
    )


def _move(rng: random.Random, o: str, p: str) -> Fact:
    hood = rng.choice(NEIGHBOURHOODS)
    s1 = Scene(
        [
            (
                0,
                f"We've been viewing flats in {hood} all week. Rent is brutal, and one "
                "place had a bathtub in the kitchen, I'm not joking.",
            )
        ],
        {"search": 0},
    )
    s2 = Scene(
        [
            (1, "So? Did the landlord call back about the one with the balcony?"),
            (
                0,
                "He did! Signed everything this afternoon, we get the keys on Friday. Tiny "
                "balcony, but the light is gorgeous.",
            ),
        ],
        {"ask": 0, "signed": 1},
    )
    return Fact(
        "move",
        [s1, s2],
        [
            (
                "multi",
                f"Where did {o}'s apartment hunt end, and what is the new home like?",
                ("0.search", "1.signed"),
                hood,
            ),
        ],
    )


def _race(rng: random.Random, o: str, p: str) -> Fact:
    city = rng.choice(CITIES)
    s1 = Scene(
        [
            (
                0,
                f"Signed up for the {city} half marathon! Training plan starts Monday, "
                "four runs a week. Somebody stop me.",
            )
        ],
        {"signup": 0},
    )
    s2 = Scene(
        [
            (1, "How's the training going? Still up at dawn?"),
            (
                0,
                "Not anymore. Shin splints, and the physio says no running at all for "
                "the next two months. I'm gutted.",
            ),
        ],
        {"ask": 0, "injury": 1},
    )
    return Fact(
        "race",
        [s1, s2],
        [
            (
                "inference",
                f"Will {o} be able to take part in the {city} race?",
                ("0.signup", "1.injury"),
                "probably not",
            ),
        ],
    )


def _language(rng: random.Random, o: str, p: str) -> Fact:
    lang = rng.choice(LANGUAGES)
    s = Scene(
        [
            (
                0,
                f"Three months of {lang} lessons and today I ordered a coffee without "
                "panicking. The waiter still answered me in English, but still.",
            )
        ],
        {"fact": 0},
    )
    return Fact(
        "language",
        [s],
        [("single", f"Which language is {o} learning?", ("0.fact",), lang)],
    )


def _concert(rng: random.Random, o: str, p: str) -> Fact:
    band = rng.choice(BANDS)
    s = Scene(
        [
            (1, f"Are you still going to see {band} at the arena next month?"),
            (
                0,
                "Wouldn't miss it for the world! I've had the tickets on my fridge since "
                "March, right next to the shopping list.",
            ),
        ],
        {"ask": 0, "yes": 1},
    )
    return Fact(
        "concert",
        [s],
        [("reference", f"Which band does {o} have gig tickets for?", ("0.ask", "0.yes"), band)],
    )


def _gift(rng: random.Random, o: str, p: str) -> Fact:
    partner, gift = rng.choice(FIRST), rng.choice(GIFTS)
    s = Scene(
        [
            (
                0,
                f"It was {partner}'s birthday yesterday. I got {gift} and she actually "
                "teared up a little when she opened it.",
            ),
            (1, "That is adorable. You're setting the bar way too high for the rest of us."),
        ],
        {"fact": 0},
    )
    return Fact(
        "gift",
        [s],
        [
            ("single", f"What present did {o} give {partner}?", ("0.fact",), gift),
            ("temporal", f"When is {partner}'s birthday?", ("0.fact",), "date"),
        ],
    )


def _volunteer(rng: random.Random, o: str, p: str) -> Fact:
    place, day = rng.choice(VOLUNTEER), rng.choice(WEEKDAYS)
    s = Scene(
        [
            (1, f"I tried to call you on {day} evening, where were you?"),
            (
                0,
                f"At the {place}! I help out there every week now on that night, it's the "
                "best part of my week to be honest.",
            ),
        ],
        {"ask": 0, "fact": 1},
    )
    return Fact(
        "volunteer",
        [s],
        [
            (
                "reference",
                f"On which evening does {o} do unpaid work, and where?",
                ("0.ask", "0.fact"),
                f"{day}, {place}",
            )
        ],
    )


def _cat(rng: random.Random, o: str, p: str) -> Fact:
    cat = rng.choice(CATS)
    s = Scene(
        [
            (
                0,
                f"{cat} knocked a full glass of juice onto my laptop this morning and then "
                "just stared at me. Cats are tiny criminals.",
            )
        ],
        {"fact": 0},
    )
    return Fact(
        "cat",
        [s],
        [
            (
                "inference",
                f"Which animal caused the damage to {o}'s computer?",
                ("0.fact",),
                f"the cat {cat}",
            )
        ],
    )


def _fear(rng: random.Random, o: str, p: str) -> Fact:
    year = rng.choice(["2009", "2012", "2015", "2017"])
    s = Scene(
        [
            (1, "We're renting a sailboat for a week in August, want to come along?"),
            (
                0,
                f"You know I can't. Ever since the storm in {year} I won't set foot on "
                "anything smaller than a ferry. Have fun for me though!",
            ),
        ],
        {"ask": 0, "fact": 1},
    )
    return Fact(
        "fear",
        [s],
        [
            (
                "inference",
                f"Would {o} enjoy a holiday out at sea on a small yacht?",
                ("0.ask", "0.fact"),
                "no",
            )
        ],
    )


BRANDS = ["Thermex", "Vaillor", "Kessling", "Ardenta", "Boschen", "Calorix", "Nordvarm"]
LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"


def _code(rng: random.Random) -> str:
    """A code as people copy them from emails: ``QX-7781``, ``RB4420K``, ``58213``."""
    letters = "".join(rng.choice(LETTERS) for _ in range(rng.randrange(2, 4)))
    digits = str(rng.randrange(1000, 99999))
    style = rng.randrange(3)
    if style == 0:
        return f"{letters}-{digits}"
    if style == 1:
        return f"{letters}{digits}{rng.choice(LETTERS)}"
    return digits


def _lookup(template: str, said: str, reply: str, asked: list[tuple[str, str]]) -> Fact:
    """A fact told in one turn (and a reply), asked about by ``(question, answer)`` lookups."""
    scene = Scene([(0, said), (1, reply)], {"fact": 0})
    return Fact(template, [scene], [("identifier", q, ("0.fact",), a) for q, a in asked])


def _parcel(rng: random.Random, o: str, p: str) -> Fact:
    code, city, day = _code(rng), rng.choice(CITIES), rng.choice(WEEKDAYS)
    return _lookup(
        "parcel",
        f"The courier finally sent me a tracking number, {code}, and apparently the thing "
        f"has been sitting in a depot outside {city} since {day}.",
        "Classic. Did they at least say when it'll move again?",
        [(f"Where is shipment {code} held up?", city), (f"Any update on {code}?", city)],
    )


def _booking(rng: random.Random, o: str, p: str) -> Fact:
    code, hour = _code(rng), rng.choice(["three", "four", "five"])
    return _lookup(
        "booking",
        f"Booked the cabin for the long weekend, reference {code}. We can't get in before "
        f"{hour} and they want the rest paid a week ahead.",
        "Send me the link, I might grab the one next door if it's free.",
        [
            (f"What time does check-in open for reservation {code}?", hour),
            (f"What was {code} for?", "cabin"),
        ],
    )


def _case(rng: random.Random, o: str, p: str) -> Fact:
    code, days = _code(rng), rng.choice(["ten", "fifteen", "twenty"])
    return _lookup(
        "case",
        f"Rang the bank about being charged twice. They opened case {code} and say it takes "
        f"{days} working days, which is a joke.",
        "Ugh, banks. At least you caught it, I never check my statements.",
        [
            (f"How long will the complaint {code} take?", days),
            (f"Remind me what {code} is.", "double charge"),
        ],
    )


def _repair(rng: random.Random, o: str, p: str) -> Fact:
    brand = rng.choice(BRANDS)
    model = f"{rng.choice(LETTERS)}{rng.choice(LETTERS)}-{rng.randrange(100, 999)}"
    return _lookup(
        "repair",
        f"The plumber says ours is a {brand} {model} and the valve it needs is out of stock "
        "until the end of the month. Cold showers it is.",
        "Oh no. Come over and use ours whenever you like, seriously.",
        [
            (f"Which part does the {model} need?", "valve"),
            (f"Is {o}'s {brand} {model} working?", "no"),
        ],
    )

MAKERS: list[Maker] = [
    _pet,
    _sibling,
    _job,
    _allergy,
    _hobby,
    _trip,
    _book,
    _car,
    _recital,
    _move,
    _race,
    _language,
    _concert,
    _gift,
    _volunteer,
    _cat,
    _fear,
    _parcel,
    _booking,
    _case,
    _repair,
]

# every template's questions belong to one split; kinds alternate between the splits
SPLIT: dict[str, str] = {
    "pet": "train",
    "sibling": "test",
    "job": "test",
    "allergy": "test",
    "hobby": "train",
    "trip": "test",
    "book": "train",
    "car": "train",
    "recital": "train",
    "move": "test",
    "race": "test",
    "language": "train",
    "concert": "test",
    "gift": "test",
    "volunteer": "train",
    "cat": "train",
    "fear": "test",
    "parcel": "train",
    "booking": "test",
    "case": "train",
    "repair": "test",
}


# ---------------------------------------------------------------------- dialogues
def _dialogue(
    index: int, seed: int, n_turns: int, people: list[str]
) -> tuple[list[Turn], list[Question]]:
    """One dialogue of about ``n_turns`` turns, with every fact template planted once."""
    rng = random.Random(f"{seed}:{index}")
    speakers = people
    owner = speakers[0]
    partner = speakers[1]
    facts = [make(rng, owner, partner) for make in MAKERS]
    n_sessions = max(9, n_turns // 20)
    # scenes go to sessions in order: a fact's later scenes go to later sessions
    placed: dict[int, list[tuple[int, int]]] = {s: [] for s in range(n_sessions)}
    for fi, fact in enumerate(facts):
        last = len(fact.scenes) - 1
        start = rng.randrange(0, n_sessions - last - (1 if last else 0))
        sessions = [start]
        for _ in range(last):
            sessions.append(rng.randrange(sessions[-1] + 1, n_sessions))
        for si, sess in enumerate(sessions):
            placed[sess].append((fi, si))
    begin = datetime(2023, 1, 2, tzinfo=UTC) + timedelta(days=rng.randrange(0, 300))
    turns: list[Turn] = []
    where: dict[tuple[int, int, str], str] = {}  # (fact, scene, mark) -> turn id
    session_dates: dict[tuple[int, int], datetime] = {}
    when = begin
    per_session = n_turns / n_sessions
    for sess in range(n_sessions):
        when = when + timedelta(days=rng.randrange(3, 21), hours=rng.randrange(-3, 4))
        when = when.replace(hour=rng.randrange(8, 22), minute=rng.randrange(60))
        lines: list[tuple[str, str, tuple[int, int, dict[str, int]] | None]] = []
        a, b = rng.sample(speakers, 2) if len(speakers) > 2 else (speakers[0], speakers[1])
        lines.append((a, _fill(rng, rng.choice(OPENERS), b), None))
        lines.append((b, _fill(rng, rng.choice(REPLIES), a), None))
        target = max(len(lines) + 4, round(per_session * rng.uniform(0.7, 1.3)))
        scenes = placed[sess]
        rng.shuffle(scenes)
        body: list[list[tuple[str, str, tuple[int, int, dict[str, int]] | None]]] = []
        for fi, si in scenes:
            scene = facts[fi].scenes[si]
            block = []
            for pos, (who, text) in enumerate(scene.lines):
                marks = {m: i for m, i in scene.marks.items() if i == pos}
                block.append(((owner, partner)[who], text, (fi, si, marks)))
            body.append(block)
        n_filler = max(0, target - 3 - sum(len(x) for x in body))
        for _ in range(n_filler // 2):
            x, y = rng.sample(speakers, 2)
            first = _fill(rng, rng.choice(FILLER_A), y)
            second = _fill(rng, rng.choice(FILLER_B), x)
            if rng.random() < 0.6:
                first += " " + rng.choice(TAILS_A)
            if rng.random() < 0.6:
                second += " " + rng.choice(TAILS_B)
            body.append([(x, first, None), (y, second, None)])
        fact_blocks = [blk for blk in body if blk[0][2] is not None]
        fillers = [blk for blk in body if blk[0][2] is None]
        rng.shuffle(fillers)
        # fact scenes go between filler exchanges at random places
        order = list(fillers)
        for blk in fact_blocks:
            order.insert(rng.randrange(0, len(order) + 1), blk)
        for blk in order:
            lines.extend(blk)
        lines.append((a, _fill(rng, rng.choice(CLOSERS), b), None))
        t = when
        for speaker, text, tag in lines:
            tid = f"d{index}-s{sess}-t{len(turns)}"
            turns.append(Turn(tid, index, sess, speaker, text, t))
            if tag is not None:
                fi, si, marks = tag
                for mark in marks:
                    where[(fi, si, mark)] = tid
                session_dates[(fi, si)] = t
            t = t + timedelta(seconds=rng.randrange(20, 240))
    questions: list[Question] = []
    for fi, fact in enumerate(facts):
        for qi, (kind, text, marks, answer) in enumerate(fact.questions):
            evidence = []
            for mark in marks:
                si, name = mark.split(".")
                evidence.append(where[(fi, int(si), name)])
            if "{month1}" in text:
                d = session_dates[(fi, 0)]
                text = text.replace("{month1}", f"{MONTHS[d.month - 1]} {d.year}")
            if "{month2}" in text:
                d = session_dates[(fi, 1)]
                text = text.replace("{month2}", f"{MONTHS[d.month - 1]} {d.year}")
            if answer == "date":
                d = session_dates[(fi, int(marks[0].split(".")[0]))]
                answer = d.date().isoformat()
            questions.append(
                Question(
                    f"q{index}-{fact.template}-{qi}",
                    text,
                    kind,
                    tuple(evidence),
                    SPLIT[fact.template],
                    fact.template,
                    answer,
                )
            )
    return turns, questions


def generate(
    n_messages: int, seed: int = 7, *, question_dialogues: int = 5, turns_per_dialogue: int = 200
) -> Corpus:
    """A corpus of about ``n_messages`` turns (exactly, after trimming) and its questions.

    Dialogues are made one after another (each from its own seeded generator, so a larger
    corpus contains every smaller one); a third of them have three speakers. Questions
    are those of the first ``question_dialogues`` dialogues.
    """
    if n_messages < turns_per_dialogue * question_dialogues:
        raise ValueError(
            f"n_messages must be >= {turns_per_dialogue * question_dialogues} "
            f"(question_dialogues x turns_per_dialogue), got {n_messages}"
        )
    pool_rng = random.Random(f"{seed}:people")
    names = list(FIRST)
    turns: list[Turn] = []
    questions: list[Question] = []
    index = 0
    while len(turns) < n_messages:
        # owners of the question dialogues are unique; later dialogues reuse names
        if index < question_dialogues:
            pick = names[3 * index : 3 * index + 3]
        else:
            pick = pool_rng.sample(names[3 * question_dialogues :], 3)
        people = pick if index % 3 == 2 else pick[:2]
        size = min(turns_per_dialogue, n_messages - len(turns))
        if size < 40:
            size = 40
        d_turns, d_questions = _dialogue(index, seed, size, people)
        turns.extend(d_turns)
        if index < question_dialogues:
            questions.extend(d_questions)
        index += 1
    if index <= question_dialogues:
        pass
    # interleave dialogues by time; drop the latest turns beyond n_messages (never question
    # dialogues' evidence: those are kept whole)
    keep_ids = {t.id for t in turns if t.dialogue < question_dialogues}
    turns.sort(key=lambda t: (t.timestamp, t.id))
    extra = len(turns) - n_messages
    if extra > 0:
        drop: set[str] = set()
        for t in reversed(turns):
            if len(drop) == extra:
                break
            if t.id not in keep_ids:
                drop.add(t.id)
        turns = [t for t in turns if t.id not in drop]
    return Corpus(turns, questions, dialogues=index)


def _main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="print a sample of the generated dialogues")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--show", type=int, default=60)
    args = parser.parse_args(argv)
    corpus = generate(args.messages, args.seed)
    first = [t for t in corpus.turns if t.dialogue == 0][: args.show]
    for t in first:
        print(f"[{t.timestamp:%Y-%m-%d %H:%M} s{t.session}] {t.speaker}: {t.text}")
    lengths = sorted(len(t.text) for t in corpus.turns)
    print(
        f"\n{len(corpus.turns)} turns in {corpus.dialogues} dialogues; text length median "
        f"{lengths[len(lengths) // 2]}, p10 {lengths[len(lengths) // 10]}, p90 "
        f"{lengths[9 * len(lengths) // 10]}"
    )
    by_id = {t.id: t for t in corpus.turns}
    for q in corpus.questions[:12]:
        print(f"\n{q.kind:9} {q.split:5} {q.text}  -> {q.answer}")
        for e in q.evidence:
            print(f"      {by_id[e].speaker}: {by_id[e].text}")
    kinds = {k: sum(q.kind == k for q in corpus.questions) for k in KINDS}
    print(f"\n{len(corpus.questions)} questions: {kinds}")


if __name__ == "__main__":
    _main()
