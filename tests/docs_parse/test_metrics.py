"""OmniDocBench-style document metrics on pages whose right answer is known."""

import pytest

from mmspec.docs_parse.metrics import page_scores, reading_order_ned, split_markdown, teds
from mmspec.docs_parse.pages import render_page


def test_a_perfect_parse_scores_perfectly_on_rendered_pages():
    refs = [render_page(s, "test").markdown for s in range(12)]
    scores = page_scores(refs, refs)
    assert scores["text_ned"] == 0.0
    assert scores["num_tables"] > 0 and scores["table_teds"] == 1.0
    assert scores["num_formulas"] > 0 and scores["formula_exact"] == 1.0 and scores["formula_ned"] == 0.0


def test_one_wrong_cell_costs_teds_and_a_missing_table_costs_all_of_it():
    ref = "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"
    wrong = ref.replace("<td>d</td>", "<td>x</td>")
    assert teds(ref, ref) == 1.0
    assert 0.7 < teds(wrong, ref) < 1.0
    assert teds(wrong, ref, structure_only=True) == 1.0  # same structure, other content
    assert page_scores(["some text"], ["some text\n\n" + ref])["table_teds"] == 0.0


def test_text_distance_is_page_level_sum_over_sum():
    scores = page_scores(["abcd", "x" * 100], ["abcx", "x" * 100])  # 1 edit over 104 characters
    assert scores["text_ned"] == pytest.approx(1 / 104)


def test_formulas_compare_without_spaces_and_split_from_text():
    parts = split_markdown("# T\n\nhello\n\n$$ a + b $$\n\n<table><tr><td>1</td></tr></table>\n\nbye")
    assert parts == {"tables": ["<table><tr><td>1</td></tr></table>"], "formulas": ["a + b"],
                     "text": ["# T", "hello", "bye"]}
    assert page_scores(["$$a+b$$"], ["$$ a + b $$"])["formula_exact"] == 1.0
    assert page_scores(["$$a-b$$"], ["$$ a + b $$"])["formula_exact"] == 0.0


def test_reading_order_distance():
    assert reading_order_ned([0, 1, 2], [0, 1, 2]) == 0.0
    assert reading_order_ned([1, 0, 2], [0, 1, 2]) == pytest.approx(2 / 3)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="predictions"):
        page_scores(["a"], ["a", "b"])
