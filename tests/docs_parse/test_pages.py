"""The rendered pages: deterministic, held out by content and layout, and ground truth that matches the pixels."""

import numpy as np
import pytest

from mmspec.docs_parse.pages import (BLOCK_TYPES, PAGE_SIZE, load_held_out_set, parse_table_html, render_page,
                                     text_pool)


def test_same_seed_same_page_and_other_seeds_differ():
    a, b = render_page(7), render_page(7)
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
    assert a.to_json() == b.to_json()
    c = render_page(8)
    assert c.markdown != a.markdown
    assert not np.array_equal(np.asarray(render_page(7, "test").image), np.asarray(a.image))


def test_held_out_split_shares_no_sentence_with_training():
    train, test = text_pool()
    assert len(test) > 500 and len(train) > 10 * len(test) // 2
    assert not set(train) & set(test)


def _ink(image, box, pad=0):
    x0, y0, x1, y1 = box
    crop = np.asarray(image.crop((x0 - pad, y0 - pad, x1 + pad, y1 + pad)), dtype=np.float32)
    return float((crop < 128).mean())


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_block_is_drawn_where_its_box_says(split):
    types = set()
    for seed in range(40):
        page = render_page(seed, split, augment=False)
        ink = (np.asarray(page.image) < 128)
        covered = np.zeros_like(ink)
        for block in page.blocks:
            assert block.type in BLOCK_TYPES and block.content.strip()
            x0, y0, x1, y1 = block.box
            assert 0 <= x0 < x1 <= PAGE_SIZE and 0 <= y0 < y1 <= PAGE_SIZE, block
            assert _ink(page.image, block.box) > 0.02, block  # something is drawn inside the box
            covered[max(0, y0 - 1):y1 + 2, max(0, x0 - 1):x1 + 2] = True  # a glyph may overhang its advance by 1 px
            types.add(block.type)
        assert not (ink & ~covered).any(), f"ink outside every block on page {seed}"  # nothing drawn untracked
        boxes = [b.box for b in page.blocks]
        for i, a in enumerate(boxes):  # blocks never overlap
            for b in boxes[i + 1:]:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    assert types == set(BLOCK_TYPES)


def test_a_tables_html_has_the_cells_drawn_in_its_grid():
    found = 0
    for seed in range(60):
        page = render_page(seed, augment=False)
        for block in page.blocks:
            if block.type != "table":
                continue
            grid = parse_table_html(block.content)
            assert len(grid) >= 3 and len({len(r) for r in grid}) == 1
            x0, y0, x1, y1 = block.box
            rows = len(grid)
            row_h = (y1 - 1 - y0) / rows
            for r in range(rows):  # every row band of the box carries ink (its cells' text)
                band = (x0, int(y0 + r * row_h) + 2, x1, int(y0 + (r + 1) * row_h) - 2)
                assert _ink(page.image, band) > 0.02, (seed, r)
            found += 1
    assert found >= 5


def test_page_markdown_is_its_blocks_in_reading_order_without_the_page_number():
    page = render_page(3)
    parts = page.markdown.split("\n\n")
    assert parts == [b.content for b in page.blocks if b.type != "page_number"]
    assert page.blocks[-1].type == "page_number"


def test_the_committed_held_out_pages_are_the_renderer_s():
    records = load_held_out_set()
    assert len(records) >= 48
    for r in records[:3]:
        page = render_page(r["seed"], "test")
        assert page.markdown == r["markdown"]
        from PIL import Image

        assert np.array_equal(np.asarray(Image.open(r["image"])), np.asarray(page.image))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="split"):
        render_page(0, "valid")
    with pytest.raises(ValueError, match="seed"):
        render_page(-1)
