"""Who said it: the participants of a conversation, by name and by what the others call them.

A question about one participant ("What does Vanessa do on weekends?") is answered by that
participant's own turns far more often than by the other speaker's: on REALTALK's first five
chats, 92-100% of such a question's evidence lies in the named participant's turns. Keyword
search matches the name where the *other* speaker uses it ("What about Vanessa?"), and the
dense side knows nothing of speakers. :class:`SpeakerNames` learns the participants from the
messages (``Message.name``) and the names they are called by, so a ranker can lift the named
participant's turns (:class:`~marsys_mem.patterns.rag.RAGMemory`'s ``speaker_weight``).

Names are matched by word, case-insensitively, with a possessive ``'s`` dropped, exactly or
fuzzily (a spelling within :data:`FUZZY` similarity, for names of 4 letters or more:
"Muhammad" finds "Muhhamed"). Aliases are learned from the conversation: a capitalised word
another participant uses to address someone ("Hey Kate!", "Thank you Kate.") or a speaker's
introduction of themselves ("I'm Kate"), counted at least :data:`ALIAS_VOTES` times, and
rarely said by that participant themselves. Learning is incremental and forgets nothing:
a removed message's votes stay (aliases are a heuristic either way).
"""

from __future__ import annotations

import difflib
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

__all__ = [
    "ALIAS_VOTES",
    "FUZZY",
    "Authored",
    "SpeakerNames",
    "normal_word",
    "same_name",
    "speaker_of",
]

ALIAS_VOTES = 3
"""How many times a word must be used to address a participant to become their alias."""

FUZZY = 0.75
"""Smallest :class:`difflib.SequenceMatcher` ratio for a word to match a name of 4+ letters."""

_QUOTE = "\u2019"  # a typographic apostrophe, as phones write "Kate\u2019s"
_WORD = re.compile(rf"[^\W\d_][^\W\d_'{_QUOTE}]*(?:['{_QUOTE}][^\W\d_]+)?")
_CAPITALISED = re.compile(r"\b[A-Z][a-z]{2,}\b")
_INTRO = re.compile(rf"\b(?:I['{_QUOTE}]m|I am|my name is|call me)\s+([A-Z][a-z]{{2,}})\b")
_GREETING = re.compile(
    r"\b(?:hey|hi|hello|thanks|thank you|bye|night|morning|congrats|sorry|wow|yes|no|oh)"
    r"\s*,?\s+([A-Z][a-z]{2,})\b",
    re.IGNORECASE,
)
_LAST_WORD = re.compile(r"[,\s]([A-Z][a-z]{2,})\s*[!?.]*\s*$")
# the same greetings, for a lower-cased ASCII text (no IGNORECASE: twice as fast)
_GREETING_LOWER = re.compile(
    r"\b(?:hey|hi|hello|thanks|thank you|bye|night|morning|congrats|sorry|wow|yes|no|oh)"
    r"\s*,?\s+([a-z]{3,})\b"
)
_INTRO_CUES = ("I'm", f"I{_QUOTE}m", "I am", "my name is", "call me")  # what _INTRO needs
_ENDING = frozenset("!?.")
_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")

_Initials = dict[str, tuple[tuple[str, tuple[str, ...]], ...]]
"""Distinct names and aliases by first letter: ``(name, the speakers it names)``."""


class Authored(Protocol):
    """A message as far as speakers go: a ``name`` and ``metadata``."""

    @property
    def name(self) -> str | None:
        """Who wrote it."""
        ...

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Its metadata (``"agent"`` names the author when ``name`` does not)."""
        ...


def speaker_of(message: Authored) -> str | None:
    """Who wrote a message: its ``name``, else ``metadata["agent"]``, else ``None``.

    Example:
        >>> from marsys_mem import Message
        >>> speaker_of(Message.user("hi", name="maya")), speaker_of(Message.user("hi"))
        ('maya', None)
    """
    name = message.name or message.metadata.get("agent")
    return name if isinstance(name, str) and name else None


def normal_word(word: str) -> str:
    """A word as names are compared: lowercased, a possessive ``'s`` dropped.

    Example:
        >>> normal_word("Kate\u2019s"), normal_word("Miami")
        ('kate', 'miami')
    """
    lower = word.lower().replace(_QUOTE, "'")
    return lower[:-2] if lower.endswith("'s") else lower


def _words(text: str) -> list[str]:
    """Lowercased words, a possessive ``'s`` dropped."""
    return [normal_word(word) for word in _WORD.findall(text)]


def _addressed(text: str) -> list[str]:
    """The capitalised words ``text`` addresses someone by: after a greeting, or last.

    What ``_GREETING`` and ``_LAST_WORD`` find (the words that start with a capital),
    found faster: the greetings in the lower-cased text when it is ASCII (the same spans),
    and the last word where it alone can start (:func:`_last_word`).

    Example:
        >>> _addressed("Hi Kate, see you Friday, Ana!"), _addressed("thanks ana")
        (['Kate', 'Ana'], [])
    """
    if text.isascii():
        found = [text[m.start(1) : m.end(1)] for m in _GREETING_LOWER.finditer(text.lower())]
    else:
        found = [m.group(1) for m in _GREETING.finditer(text)]
    words = [w for w in found if w[0].isupper()]
    last = _last_word(text)
    if last is not None:
        words.append(last)
    return words


def _last_word(text: str) -> str | None:
    """``_LAST_WORD``'s match in ``text`` (at most one: it ends the text), or ``None``.

    A match ends where the text's trailing spaces and ``!?.`` begin, its word is the run
    of lower-case letters before that and one capital, and a comma or space comes before
    it: so it can start at one place only, which is tried alone instead of every place.
    """
    end = len(text)
    while end and (text[end - 1] in _ENDING or text[end - 1].isspace()):
        end -= 1
    start = end
    while start and text[start - 1] in _LOWER:
        start -= 1
    if end - start < 2 or start < 2 or not ("A" <= text[start - 1] <= "Z"):
        return None
    found = _LAST_WORD.match(text, start - 2)
    return found.group(1) if found is not None else None


class SpeakerNames:
    """The participants of a conversation and their aliases, learned from its messages.

    :meth:`observe` each message (its speaker and text, in order; ``thread`` keeps
    interleaved conversations apart: an address is to the previous speaker of the same
    thread). :meth:`named` says which one participant a query names, if exactly one.
    Thread-safe.

    Example:
        >>> names = SpeakerNames()
        >>> for speaker, text in [("Emi", "Hi! I'm Kate."), ("elise", "Hey Kate!"),
        ...                       ("Emi", "How was Miami?"), ("elise", "Great, thanks Kate"),
        ...                       ("Emi", "Lovely"), ("elise", "Talk soon Kate.")]:
        ...     names.observe(speaker, text)
        >>> names.named("What does Kate cook?"), names.named("Where did Elise go?")
        ('Emi', 'elise')
        >>> names.named("Did Kate and Elise meet?") is None  # both: no one in particular
        True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, set[str]] = {}  # speaker -> the words of their name
        self._said: Counter[tuple[str, str]] = Counter()  # (speaker, word) they wrote
        self._total: Counter[str] = Counter()  # capitalised word -> turns that have it
        self._votes: Counter[tuple[str, str]] = Counter()  # (addressee, word)
        self._last: dict[str, str] = {}  # thread -> its last speaker
        self._turns: Counter[str] = Counter()  # speaker -> messages observed
        self._forms: dict[str, frozenset[str]] | None = None  # speaker -> names and aliases
        # the forms they were made from, and each distinct form (with the speakers it
        # names) by its first letter
        self._initials: tuple[dict[str, frozenset[str]], _Initials] | None = None

    def __len__(self) -> int:
        return len(self._names)

    @property
    def speakers(self) -> list[str]:
        """The participants seen, in order of first appearance."""
        with self._lock:
            return list(self._names)

    def observe(self, speaker: str | None, text: str, thread: str = "") -> None:
        """Learn from one message: its speaker (``None``: nobody in particular) and text."""
        if not speaker:
            return
        with self._lock:
            self._forms = None
            self._turns[speaker] += 1
            if speaker not in self._names:
                self._names[speaker] = {w for w in _words(speaker) if len(w) >= 2}
            for word in set(_CAPITALISED.findall(text)):
                self._said[(speaker, word)] += 1
                self._total[word] += 1
            if any(cue in text for cue in _INTRO_CUES):
                for found in _INTRO.finditer(text):
                    self._votes[(speaker, found.group(1))] += ALIAS_VOTES
            addressee = self._last.get(thread)
            if addressee is not None and addressee != speaker:
                for word in _addressed(text):
                    self._votes[(addressee, word)] += 1
            self._last[thread] = speaker

    def aliases(self) -> dict[str, set[str]]:
        """Each participant's learned aliases (lowercased), beside the words of their name.

        Example:
            >>> names = SpeakerNames()
            >>> names.observe("Emi", "Hello, I'm Kate")
            >>> names.aliases()
            {'Emi': {'kate'}}
        """
        with self._lock:
            return {s: set(f) - self._names[s] for s, f in self._forms_locked().items()}

    def name_words(self, min_share: float = 0.0) -> frozenset[str]:
        """The name words and learned aliases (lowercased) of the participants, together.

        Args:
            min_share: only of the participants who wrote at least this share of the
                messages observed (0.2: a conversation of a few people, not one of the
                many people of a shared memory, whose names tell conversations apart).

        Example:
            >>> names = SpeakerNames()
            >>> names.observe("Fahim Khan", "Hello, I'm Fay")
            >>> for _ in range(4):
            ...     names.observe("Akib", "hi")
            >>> sorted(names.name_words()), sorted(names.name_words(min_share=0.5))
            (['akib', 'fahim', 'fay', 'khan'], ['akib'])
        """
        with self._lock:
            least = min_share * sum(self._turns.values())
            return frozenset(
                word
                for speaker, forms in self._forms_locked().items()
                if self._turns[speaker] >= least
                for word in forms
            )

    def _forms_locked(self) -> dict[str, frozenset[str]]:
        if self._forms is None:
            forms = {s: set(words) for s, words in self._names.items()}
            for (addressee, word), votes in self._votes.items():
                lower = word.lower()
                if (
                    votes >= ALIAS_VOTES
                    and self._said[(addressee, word)] <= 0.2 * self._total[word] + 1
                    and not any(lower in w for s, w in self._names.items() if s != addressee)
                ):
                    forms[addressee].add(lower)
            self._forms = {s: frozenset(f) for s, f in forms.items()}
        return self._forms

    def named(self, query: str, speakers: Iterable[str] = ()) -> str | None:
        """The one participant ``query`` names (by name or alias), else ``None``.

        Args:
            query: the question.
            speakers: more participants to consider, known by name only (e.g. the speakers
                of a store's candidates, where this memory observed no messages).
        """
        with self._lock:
            known = self._forms_locked()
            initials = self._initials_locked()
        extra: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for speaker in dict.fromkeys(speakers):  # each once: a store's turns repeat them
            if speaker and speaker not in known:
                for name in {w for w in _words(speaker) if len(w) >= 2}:
                    extra.setdefault(name[0], []).append((name, (speaker,)))
        if not known and not extra:
            return None
        words = {w for w in _words(query) if len(w) >= 3}
        # same_name() holds only between words of the same first letter: each word is
        # compared with those names only, each distinct name once (a big store knows
        # thousands of speakers, who share learned aliases: "sunday", "night"); a second
        # speaker named settles it
        named: set[str] = set()
        for word in words:
            for group in (initials.get(word[0], ()), extra.get(word[0], ())):
                for name, owners in group:
                    if same_name(word, name):
                        named.update(owners)
                        if len(named) > 1:
                            return None
        return named.pop() if named else None

    def _initials_locked(self) -> _Initials:
        """The distinct names and aliases of the known forms by first letter, and their speakers."""
        forms = self._forms_locked()
        if self._initials is None or self._initials[0] is not forms:
            owners: dict[str, list[str]] = {}
            for speaker, names in forms.items():
                for name in names:
                    if name:
                        owners.setdefault(name, []).append(speaker)
            groups: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
            for name, of in owners.items():
                groups.setdefault(name[0], []).append((name, tuple(of)))
            self._initials = (forms, {k: tuple(v) for k, v in groups.items()})
        return self._initials[1]


def same_name(word: str, name: str) -> bool:
    """Whether ``word`` is ``name`` (both as :func:`normal_word` gives them), or a spelling of it.

    Exactly, or for words and names of 4 letters or more with the same first letter, a
    :class:`difflib.SequenceMatcher` ratio of at least :data:`FUZZY`.

    Example:
        >>> same_name("muhammad", "muhhamed"), same_name("max", "maxi"), same_name("kate", "kate")
        (True, False, True)
    """
    if word == name:
        return True
    short, total = min(len(word), len(name)), len(word) + len(name)
    if short < 4 or word[0] != name[0]:
        return False
    # the bounds first, cheapest first: real_quick_ratio()'s (from the lengths alone,
    # computed as difflib does), before a matcher is even made
    if 2.0 * short / total < FUZZY:
        return False
    match = difflib.SequenceMatcher(None, word, name)
    return match.quick_ratio() >= FUZZY and match.ratio() >= FUZZY
