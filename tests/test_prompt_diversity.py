"""Diversity figures of a prompt set, against counts made by hand."""

from dspark.data.prompts.diversity import prompt_diversity


def test_figures_by_hand():
    texts = ["Write a poem about cats.", "write a story about dogs and cats", "What is 2+2?"]
    d = prompt_diversity(texts)
    # first words: write x2, what x1
    assert d["first_words"] == {"distinct": 2, "share": 0.6667, "top": {"write": 2, "what": 1}}
    # 3-grams: 3 + 5 + 2 (what is 2, is 2 2), none repeated
    assert d["trigrams"] == {"distinct": 10, "total": 10, "share": 1.0}
    # lengths 5, 7, 4 words; nearest-rank percentiles of [4, 5, 7]; chars 24, 34, 12
    assert d["words"] == {"p10": 4, "p50": 5, "p90": 7, "max": 7} and d["chars_p50"] == 24


def test_a_repeated_phrase_lowers_the_trigram_share():
    d = prompt_diversity(["tell me a joke", "tell me a story", "tell me a joke"])
    # 2 + 2 + 2 trigrams; distinct: tell me a, me a joke, me a story
    assert d["trigrams"] == {"distinct": 3, "total": 6, "share": 0.5}
    assert d["first_words"]["distinct"] == 1 and d["rows"] == 3
    assert prompt_diversity([])["words"] == {"p10": 0, "p50": 0, "p90": 0, "max": 0}
