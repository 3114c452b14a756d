"""Rendered pages with layout ground truth: the document substrate's data.

A page is drawn with PIL in DejaVu fonts (the copies matplotlib ships, so nothing comes from apt): one or
two columns of titles, paragraphs, lists, tables drawn from cell grids, formulas rendered by matplotlib's
mathtext, captions and a page number. Every block keeps its box, its type and its content as markdown
(tables as HTML, formulas as `$$ LaTeX $$`), and the page's markdown is its blocks in reading order
(the page number is layout only, as OmniDocBench leaves page furniture out of the text metrics).

    page = render_page(seed=3, split="train")
    page.image          # PIL "L" image, PAGE_SIZE x PAGE_SIZE, lightly augmented
    page.markdown       # reading-order markdown
    page.blocks         # [Block(type, box=(x0, y0, x1, y1), content)]

Everything is a function of (seed, split): the same call gives the same pixels. The held-out split uses
other sentences (a fixed hash split of the text pool) *and* other layout seeds (a separate random stream),
so a model is never tested on a sentence or an arrangement it trained on.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

PAGE_SIZE = 320  # pixels, square (the VLM's input size)
BLOCK_TYPES = ("title", "text", "list", "table", "formula", "caption", "page_number")
SPLITS = ("train", "test")
MARGIN = 14
COLUMN_GAP = 12
BUNDLED_DIR = Path(__file__).parent / "bundled"
HELD_OUT_DIR = BUNDLED_DIR / "pages_test"
TEXT_POOL = BUNDLED_DIR / "text" / "docstrings.txt"  # with the speech substrate's fortunes sentences


@dataclass
class Block:
    type: str  # one of BLOCK_TYPES
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1) pixels, x1 / y1 exclusive
    content: str  # this block's markdown (a table as HTML, a formula as $$ ... $$)


@dataclass
class Page:
    image: Image.Image  # "L", PAGE_SIZE x PAGE_SIZE
    blocks: list[Block]  # reading order
    seed: int
    split: str
    meta: dict = field(default_factory=dict)  # layout choices (columns, fonts), for inspection

    @property
    def markdown(self) -> str:
        return page_markdown(self.blocks)

    def to_json(self) -> dict:
        return {"seed": self.seed, "split": self.split, "markdown": self.markdown, "meta": self.meta,
                "blocks": [asdict(b) for b in self.blocks]}


def page_markdown(blocks: list[Block]) -> str:
    """A page's markdown: its blocks' content in reading order, page furniture left out."""
    return "\n\n".join(b.content for b in blocks if b.type != "page_number")


# --- fonts and text ------------------------------------------------------------------------------------

def font_dir() -> str:
    import matplotlib

    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf")


FAMILIES = {"sans": ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf"),
            "serif": ("DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf")}


@functools.lru_cache(maxsize=64)
def load_font(family: str, style: int, size: int) -> ImageFont.FreeTypeFont:
    """style: 0 regular, 1 bold, 2 italic."""
    return ImageFont.truetype(os.path.join(font_dir(), FAMILIES[family][style]), size)


@functools.lru_cache(maxsize=1)
def text_pool() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train, test) sentences: everyday prose (the fortunes list) and technical prose (stdlib docstrings),
    split by a hash by a hash of each sentence (about 1 in 10 held out),
    so the split does not move when the pool grows."""
    from mmspec.speech.text import fortune_sentences

    with open(TEXT_POOL, encoding="utf-8") as f:
        technical = [s for s in f.read().splitlines() if s.strip()]
    sentences = [s for s in fortune_sentences() if len(s.split()) >= 4] + technical
    train, test = [], []
    for s in sentences:
        (test if int(hashlib.sha1(s.encode()).hexdigest()[:8], 16) % 10 == 0 else train).append(s)
    return tuple(train), tuple(test)


@functools.lru_cache(maxsize=len(SPLITS))
def table_words(split: str) -> list[str]:
    """Short words of the split's sentences, for table cells (computed once, not per page)."""
    sentences = text_pool()[SPLITS.index(split)]
    return sorted({w for s in sentences[:2000] for w in s.split() if 2 < len(w) < 9})


def wrap(text: str, font, width: int) -> list[str]:
    """Greedy line breaking at spaces; a word wider than the line is put on its own line."""
    lines, current = [], ""
    for word in text.split():
        trial = word if not current else current + " " + word
        if font.getlength(trial) <= width or not current:
            current = trial
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def line_height(font) -> int:
    ascent, descent = font.getmetrics()
    return ascent + descent + 1


# --- formulas ----------------------------------------------------------------------------------------

_SYMBOLS = ("x", "y", "z", "a", "b", "n", "k", "t", r"\alpha", r"\beta", r"\lambda", r"\theta", r"\mu",
            r"\sigma")


def random_formula(rng: random.Random) -> str:
    """A short LaTeX formula from a small grammar (fractions, sums, roots, scripts, Greek letters)."""
    def atom():
        s = rng.choice(_SYMBOLS)
        r = rng.random()
        if r < 0.25:
            return f"{s}_{{{rng.choice('ijkn0123')}}}"
        if r < 0.45:
            return f"{s}^{{{rng.choice('23n')}}}"
        if r < 0.55:
            return str(rng.randint(2, 99))
        return s

    def term(depth=0):
        r = rng.random()
        if depth < 1 and r < 0.2:
            return rf"\frac{{{term(depth + 1)}}}{{{term(depth + 1)}}}"
        if depth < 1 and r < 0.3:
            return rf"\sqrt{{{term(depth + 1)}}}"
        if depth < 1 and r < 0.4:
            return rf"\sum_{{{rng.choice('ikn')}=1}}^{{{rng.choice(['n', 'N', 'K'])}}} {atom()}"
        return " ".join(atom() for _ in range(rng.randint(1, 2)))

    ops = ["+", "-", "=", r"\leq", r"\cdot"]
    parts = [term()]
    for _ in range(rng.randint(1, 3)):
        parts += [rng.choice(ops), term()]
    return " ".join(parts)


@functools.lru_cache(maxsize=4096)
def render_formula(latex: str, size: int) -> Image.Image:
    """The formula drawn by matplotlib mathtext in DejaVu Sans: an "L" image, black on white, tight."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties

    buf = io.BytesIO()
    mathtext.math_to_image(f"${latex}$", buf, prop=FontProperties(size=size), dpi=72, format="png")
    rgba = Image.open(buf).convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("L")


# --- tables ------------------------------------------------------------------------------------------

_HEADER_WORDS = ("name", "value", "year", "count", "score", "model", "size", "rate", "item", "cost", "time",
                 "step", "loss", "type", "level")


def random_table(rng: random.Random, words: list[str]) -> list[list[str]]:
    """A cell grid: a header row of labels, then rows of words and numbers."""
    rows, cols = rng.randint(2, 4), rng.randint(2, 3)
    header = rng.sample(_HEADER_WORDS, cols)
    grid = [header]
    for _ in range(rows):
        row = []
        for c in range(cols):
            r = rng.random()
            if c == 0 or r < 0.3:
                row.append(rng.choice(words))
            elif r < 0.65:
                row.append(str(rng.randint(0, 999)))
            else:
                row.append(f"{rng.randint(0, 99)}.{rng.randint(0, 99):02d}")
        grid.append(row)
    return grid


def table_html(grid: list[list[str]]) -> str:
    return "<table>" + "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                               for row in grid) + "</table>"


def table_markdown(grid: list[list[str]]) -> str:
    lines = ["| " + " | ".join(grid[0]) + " |", "|" + "---|" * len(grid[0])]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in grid[1:]])


def parse_table_html(html: str) -> list[list[str]]:
    """The cell grid of a `table_html` string (what a model's table output is read back into)."""
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", html)]


# --- the page ------------------------------------------------------------------------------------------

class _Layout:
    """Places blocks top to bottom in the current column, moving to the next column when one is full."""

    def __init__(self, columns: int):
        width = PAGE_SIZE - 2 * MARGIN
        self.column_width = width if columns == 1 else (width - COLUMN_GAP) // 2
        self.columns = columns
        self.column = 0
        self.top = MARGIN
        self.full_width_bottom = MARGIN  # where columns start: under a full-width title, if any
        self.bottom = PAGE_SIZE - MARGIN - 14  # room for the page number

    @property
    def left(self) -> int:
        return MARGIN + self.column * (self.column_width + COLUMN_GAP)

    def place(self, height: int) -> tuple[int, int] | None:
        """(x, y) for a block of this height, or None when the page is full."""
        while self.top + height > self.bottom:
            if self.column + 1 >= self.columns:
                return None
            self.column += 1
            self.top = self.full_width_bottom
        x, y = self.left, self.top
        return x, y


def _sentence_case(s: str) -> str:
    return s[:1].upper() + s[1:]


def render_page(seed: int, split: str = "train", augment: bool = True) -> Page:
    """The page of `seed` in `split` (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    # Separate random streams per split: a test page's layout never repeats a training seed's.
    rng = random.Random(f"{split}:{int(seed)}")
    sentences = text_pool()[SPLITS.index(split)]
    words = table_words(split)
    family = rng.choice(sorted(FAMILIES))
    size = rng.randint(10, 12)
    columns = 1 if rng.random() < 0.55 else 2
    image = Image.new("L", (PAGE_SIZE, PAGE_SIZE), 255)
    draw = ImageDraw.Draw(image)
    ink = rng.randint(0, 50)
    layout = _Layout(columns)
    blocks: list[Block] = []

    if rng.random() < 0.8:  # a title across the full width
        font = load_font(family, 1, size + rng.randint(3, 6))
        text = _sentence_case(rng.choice(sentences))
        lines = wrap(text, font, PAGE_SIZE - 2 * MARGIN)[:2]
        text = " ".join(lines)
        h = len(lines) * line_height(font)
        for i, ln in enumerate(lines):
            draw.text((MARGIN, MARGIN + i * line_height(font)), ln, font=font, fill=ink)
        w = max(int(font.getlength(ln)) for ln in lines)
        blocks.append(Block("title", (MARGIN, MARGIN, MARGIN + w, MARGIN + h), "# " + text))
        layout.top = layout.full_width_bottom = MARGIN + h + 8

    body = load_font(family, 0, size)
    kinds = ["text", "text", "list", "table", "formula", "text"]
    rng.shuffle(kinds)
    for kind in kinds + ["text"] * 4:
        block = _draw_block(kind, rng, draw, image, layout, body, family, size, sentences, words, ink)
        if block is None:
            break
        blocks.extend(block)

    number = str(rng.randint(1, 300))
    font = load_font(family, 0, size - 1)
    w = int(font.getlength(number))
    x, y = (PAGE_SIZE - w) // 2, PAGE_SIZE - MARGIN - line_height(font) + 2
    draw.text((x, y), number, font=font, fill=ink)
    blocks.append(Block("page_number", (x, y, x + w, y + line_height(font)), number))

    if augment:
        image = augment_page(image, rng)
    return Page(image=image, blocks=blocks, seed=int(seed), split=split,
                meta={"family": family, "size": size, "columns": columns})


def _draw_block(kind, rng, draw, image, layout, body, family, size, sentences, words, ink):
    """Draw one block where the layout puts it; a list of blocks (a table or figure-like block may bring its
    caption), or None when the page is full."""
    width = layout.column_width
    lh = line_height(body)
    if kind == "text":
        text = " ".join(_sentence_case(s) + "." for s in rng.sample(sentences, rng.randint(1, 2)))
        lines = wrap(text, body, width)
        lines = lines[: rng.randint(2, 5)]
        text = " ".join(lines)
        spot = layout.place(len(lines) * lh)
        if spot is None:
            return None
        x, y = spot
        for i, ln in enumerate(lines):
            draw.text((x, y + i * lh), ln, font=body, fill=ink)
        w = max(int(body.getlength(ln)) for ln in lines)
        layout.top = y + len(lines) * lh + 7
        return [Block("text", (x, y, x + w, y + len(lines) * lh), text)]
    if kind == "list":
        items = [_sentence_case(" ".join(s.split()[:5])) for s in rng.sample(sentences, rng.randint(2, 3))]
        bullet = "\u2022 "
        lines = []
        for item in items:
            wrapped = wrap(item, body, width - int(body.getlength(bullet)))[:1]
            lines.append(wrapped[0])
        spot = layout.place(len(lines) * lh)
        if spot is None:
            return None
        x, y = spot
        indent = int(body.getlength(bullet))
        for i, ln in enumerate(lines):
            draw.text((x, y + i * lh), bullet, font=body, fill=ink)
            draw.text((x + indent, y + i * lh), ln, font=body, fill=ink)
        w = max(indent + int(body.getlength(ln)) for ln in lines)
        layout.top = y + len(lines) * lh + 7
        return [Block("list", (x, y, x + w, y + len(lines) * lh), "\n".join("- " + ln for ln in lines))]
    if kind == "table":
        grid = random_table(rng, words)
        font = load_font(family, 0, size - 1)
        bold = load_font(family, 1, size - 1)
        pad = 3
        col_w = [max(int(max(bold.getlength(r[c]), font.getlength(r[c]))) for r in grid) + 2 * pad
                 for c in range(len(grid[0]))]
        if sum(col_w) > width:
            return []  # too wide for this column: skip the table, keep filling
        rh = line_height(font) + 2 * pad - 1
        h = rh * len(grid)
        caption = rng.random() < 0.5
        cap_font = load_font(family, 2, size - 1)
        cap_text = f"Table {rng.randint(1, 9)}: " + " ".join(rng.choice(sentences).split()[:4])
        cap_lines = wrap(cap_text, cap_font, width)[:1] if caption else []
        cap_text = cap_lines[0] if cap_lines else ""
        spot = layout.place(h + (line_height(cap_font) + 3 if caption else 0))
        if spot is None:
            return None
        x, y = spot
        out = []
        if caption:
            draw.text((x, y), cap_text, font=cap_font, fill=ink)
            cw = int(cap_font.getlength(cap_text))
            out.append(Block("caption", (x, y, x + cw, y + line_height(cap_font)), cap_text))
            y += line_height(cap_font) + 3
        full_grid = rng.random() < 0.5  # all borders, or booktabs-style rules
        total_w = sum(col_w)
        for r, row in enumerate(grid):
            cx = x
            for c, cell in enumerate(row):
                draw.text((cx + pad, y + r * rh + pad - 1), cell, font=bold if r == 0 else font, fill=ink)
                if full_grid:
                    draw.rectangle((cx, y + r * rh, cx + col_w[c], y + (r + 1) * rh), outline=ink)
                cx += col_w[c]
        if not full_grid:
            for yy in (y, y + rh, y + h):
                draw.line((x, yy, x + total_w, yy), fill=ink)
        layout.top = y + h + 8
        out.append(Block("table", (x, y, x + total_w + 1, y + h + 1), table_html(grid)))
        return out
    if kind == "formula":
        latex = random_formula(rng)
        formula = render_formula(latex, size + 1)
        if formula.width > width:
            return []
        spot = layout.place(formula.height)
        if spot is None:
            return None
        x, y = spot
        x += (width - formula.width) // 2  # display formulas are centred in their column
        image.paste(formula, (x, y))
        layout.top = y + formula.height + 7
        return [Block("formula", (x, y, x + formula.width, y + formula.height), f"$$ {latex} $$")]
    raise ValueError(f"unknown block kind {kind!r}")


def augment_page(image: Image.Image, rng: random.Random) -> Image.Image:
    """Light scan-like degradation: a small rotation, blur, noise and JPEG, each drawn per page."""
    if rng.random() < 0.5:
        image = image.rotate(rng.uniform(-0.8, 0.8), resample=Image.BILINEAR, fillcolor=255)
    if rng.random() < 0.5:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.2, 0.6)))
    if rng.random() < 0.5:
        noise = np.random.default_rng(rng.getrandbits(32)).normal(0, rng.uniform(2, 8), (PAGE_SIZE, PAGE_SIZE))
        image = Image.fromarray(np.clip(np.asarray(image, dtype=np.float32) + noise, 0, 255).astype(np.uint8))
    if rng.random() < 0.5:
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=rng.randint(60, 95))
        image = Image.open(io.BytesIO(buf.getvalue())).convert("L")
    return image


# --- the committed held-out set ------------------------------------------------------------------------

def write_held_out_set(directory: str | os.PathLike, num_pages: int) -> None:
    """Render test pages 0 … num_pages−1 as PNG + one JSON of ground truth."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in range(num_pages):
        page = render_page(seed, "test")
        name = f"page_{seed:03d}.png"
        page.image.save(directory / name)
        records.append({"image": name, **page.to_json()})
    (directory / "pages.json").write_text(json.dumps(records, indent=1))


def load_held_out_set(directory: str | os.PathLike | None = None) -> list[dict]:
    """The committed held-out pages: dicts with `image` (a path), `markdown`, `blocks` (type, box, content)."""
    directory = Path(directory or HELD_OUT_DIR)
    path = directory / "pages.json"
    if not path.exists():
        raise FileNotFoundError(f"no held-out pages at {directory} (python examples/make_doc_data.py writes them)")
    records = json.loads(path.read_text())
    for r in records:
        r["image"] = str(directory / r["image"])
        r["blocks"] = [Block(b["type"], tuple(b["box"]), b["content"]) for b in r["blocks"]]
    return records
