"""Ranking and Ingest: the settings models of RAGMemory, their presets and their checks."""

import typing

import pytest
from pydantic import ValidationError

from marsys_mem.model.ranking import PRESETS, Ingest, RagOptions, Ranking, resolve_settings
from marsys_mem.patterns.rag import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.scoring import fuse_scores


def test_the_defaults_are_the_conversation_preset():
    assert Ranking() == Ranking.of("conversation") == Ranking.model_validate("conversation")
    r = Ranking()
    assert (r.mode, r.fusion, r.dense_weight, r.bm25_weight, r.candidates) == (
        "hybrid",
        "zscore",
        1.3,
        1.0,
        100,
    )
    assert (r.context_turns, r.thread_weight, r.speaker_weight, r.question_weight) == (
        3,
        0.2,
        0.5,
        0.15,
    )
    assert r.in_context


def test_notes_turns_off_every_cue_of_a_conversation():
    notes = Ranking.of("notes")
    assert notes.preset == "notes"
    assert notes.context_turns == 0
    assert notes.thread_weight == 0.0
    assert notes.speaker_weight == 0.0
    assert notes.strip_names is False
    assert notes.index_names is False
    assert notes.question_weight == 0.0
    assert notes.dense_weight == 1.5
    assert not notes.in_context
    # the time cues stay
    assert notes.time_weight == Ranking().time_weight


def test_every_preset_names_only_real_fields_with_valid_values():
    assert set(Ranking.presets()) == set(PRESETS)
    for name, fields in PRESETS.items():
        assert set(fields) <= set(Ranking.model_fields) - {"preset"}
        made = Ranking.of(name)  # type: ignore[arg-type]
        for field, value in fields.items():
            assert getattr(made, field) == value


def test_overrides_go_on_top_of_the_preset_and_the_rest_stays():
    r = Ranking.of("notes", dense_weight=1.0, diversity=0.2)
    assert (r.dense_weight, r.diversity, r.context_turns) == (1.0, 0.2, 0)
    assert Ranking(preset="notes", dense_weight=1.0, diversity=0.2) == r
    assert Ranking.model_validate({"preset": "notes", "dense_weight": 1.0, "diversity": 0.2}) == r
    # replace keeps every field (the preset fills nothing back in)
    assert r.replace(context_turns=2).context_turns == 2
    assert r.replace(context_turns=2).dense_weight == 1.0


def test_a_dump_loads_back_the_same_ranking():
    r = Ranking.of("notes", fusion="rrf", rrf_k=60, thread_key=None)
    assert Ranking.model_validate(r.model_dump()) == r
    assert Ranking.model_validate_json(r.model_dump_json()) == r


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dense_weight", -0.1),
        ("dense_weight", float("nan")),
        ("dense_weight", "1.3"),
        ("rrf_k", -1),
        ("rrf_k", 2.5),
        ("candidates", 0),
        ("context_turns", 9),
        ("context_turns", True),
        ("b", 1.5),
        ("strip_names", 0),
        ("thread_key", 3),
        ("thread_key", ""),
        ("mode", "semantic"),
        ("fusion", "sum"),
        ("preset", "chat"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_the_value(field, value):
    with pytest.raises(ValidationError) as info:
        Ranking.model_validate({field: value})
    err = info.value.errors()[0]
    assert err["loc"] == (field,)
    assert err["input"] == value or (value != value and err["input"] != err["input"])


def test_unknown_fields_and_both_weights_zero_are_refused():
    with pytest.raises(ValidationError, match="dense_wieght"):
        Ranking.model_validate({"dense_wieght": 1.0})
    with pytest.raises(ValidationError, match="cannot both be 0"):
        Ranking(dense_weight=0, bm25_weight=0)
    with pytest.raises(ValidationError, match="batch_size"):
        Ingest(batch_size=0)
    with pytest.raises(ValidationError, match="index_kind"):
        Ingest.model_validate({"index_kind": "lsh"})


def test_the_models_are_frozen():
    with pytest.raises(ValidationError):
        Ranking().dense_weight = 2.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Ingest().background = False  # type: ignore[misc]


def test_the_keyword_options_are_exactly_the_fields_of_both_models():
    keys = set(typing.get_type_hints(RagOptions))
    assert keys == (set(Ranking.model_fields) - {"preset"}) | set(Ingest.model_fields)
    # and no field is in both
    assert not set(Ranking.model_fields) & set(Ingest.model_fields)


def test_resolve_takes_a_model_a_name_or_a_mapping_with_options_on_top():
    base = Ranking.of("notes", diversity=0.1)
    for given in (base, {"preset": "notes", "diversity": 0.1}):
        ranking, ingest = resolve_settings(given, {"batch_size": 8}, {"mode": "bm25"})
        assert ranking == base.replace(mode="bm25")
        assert ingest == Ingest(batch_size=8)
    ranking, ingest = resolve_settings("notes", Ingest(background=False), {"max_chars": 10})
    assert ranking == Ranking.of("notes")
    assert ingest == Ingest(background=False, max_chars=10)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dense_wieght'"):
        resolve_settings(None, None, {"dense_wieght": 1.0})
    with pytest.raises(TypeError, match="ranking must be"):
        resolve_settings(3, None, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ingest must be"):
        resolve_settings(None, 3, {})  # type: ignore[arg-type]


def test_ragmemory_takes_a_ranking_a_preset_or_a_mapping_and_keywords_on_top():
    emb = HashingEmbedder(32)
    with RAGMemory(emb, ranking="notes", background=False, context_turns=1) as mem:
        assert mem.ranking == Ranking.of("notes", context_turns=1)
        assert mem.ingest == Ingest(background=False)
    with RAGMemory(emb, ranking={"preset": "notes"}, ingest={"batch_size": 4}) as mem:
        assert mem.ranking == Ranking.of("notes")
        assert mem.ingest.batch_size == 4
    with RAGMemory(emb, fusion="rrf", mode="bm25") as mem:  # the keywords alone, as before
        assert mem.ranking == Ranking(fusion="rrf", mode="bm25")
        assert mem.mode == "bm25"
    with pytest.raises(TypeError, match="dense_wieght"):
        RAGMemory(emb, dense_wieght=1.0)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"context_turns[\s\S]*input_value=9"):
        RAGMemory(emb, ranking="notes", context_turns=9)


def test_a_memory_ranking_may_change_but_not_what_its_indexes_were_built_with():
    with RAGMemory(HashingEmbedder(32), background=False) as mem:
        mem.add_many(["alpha beta", "gamma delta"])
        mem.ranking = mem.ranking.replace(fusion="rrf", context_turns=0)
        assert mem.search("alpha", k=1, min_score=None)[0].text == "alpha beta"
        for field, value in (("k1", 1.2), ("b", 0.5), ("index_names", False), ("thread_key", None)):
            with pytest.raises(ValueError, match=f"built with {field}="):
                mem.ranking = mem.ranking.replace(**{field: value})
        with pytest.raises(TypeError, match="must be a Ranking"):
            mem.ranking = "notes"  # type: ignore[assignment]
        assert mem.ranking.fusion == "rrf"  # the refused changes changed nothing
    with RAGMemory(None) as bm25_only:
        with pytest.raises(ValueError, match="needs an embedder"):
            bm25_only.ranking = bm25_only.ranking.replace(mode="dense")
        bm25_only.ranking = bm25_only.ranking.replace(mode="hybrid")
        assert bm25_only.mode == "bm25"


def test_notes_ranks_each_note_by_its_own_scores_alone():
    """Under ``notes`` the ranking is the fusion of each note's own two scores, no more."""
    texts = [
        "the boiler manual says to bleed the radiators in October",
        "shopping list: eggs, flour, milk",
        "the radiators in the attic rattle when the boiler starts",
        "call the plumber about the radiators",
        "Is the boiler fine?",
    ]
    query = "boiler radiators"
    with RAGMemory(HashingEmbedder(64), background=False, ranking="notes") as notes:
        notes.add_many(texts)
        hits = notes.search(query, k=5, min_score=None)
        own = {h.id: (h.dense_score, h.bm25_score) for h in hits}
        dense = sorted(((i, d) for i, (d, _) in own.items()), key=lambda x: -x[1])
        bm25 = sorted(((i, b) for i, (_, b) in own.items() if b), key=lambda x: -x[1])
        expected = fuse_scores(
            dense,
            bm25,
            dict(dense),
            {i: b for i, (_, b) in own.items()},
            fusion="zscore",
            dense_weight=1.5,
            bm25_weight=1.0,
        )
        assert [h.id for h in hits] == [c[0] for c in expected]
        assert [h.fused for h in hits] == pytest.approx([c[1] for c in expected])


def test_the_settings_are_not_attributes_of_the_memory_and_say_where_they_are():
    with RAGMemory(HashingEmbedder(32), fusion="rrf") as mem:
        assert mem.mode == "hybrid"  # the mode the memory searches in stays an attribute
        with pytest.raises(AttributeError, match=r"field of its ranking \(mem.ranking.fusion\)"):
            _ = mem.fusion  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match=r"mem.ingest.batch_size"):
            _ = mem.batch_size  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match=r"mem.ranking = mem.ranking.replace\(fusion="):
            mem.fusion = "zscore"  # type: ignore[attr-defined]
        assert mem.ranking.fusion == "rrf"
        with pytest.raises(AttributeError, match="no attribute 'nothing'"):
            _ = mem.nothing  # type: ignore[attr-defined]
