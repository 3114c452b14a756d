"""Document-parsing quality as OmniDocBench measures it (text, tables, formulas, reading order).

- Text: page-level normalized edit distance, Σ Levenshtein / Σ max(len) over the pages' text blocks
  (OmniDocBench's `calc_page_edit_dist`: long pages weigh more than short ones). 0 is perfect.
- Tables: TEDS (tree edit distance similarity of the HTML, `table-recognition-metric`, IBM's PubTabNet
  code), 1 is perfect; `structure_only` TEDS-S beside it.
- Formulas: normalized edit distance of the LaTeX with spaces removed, and the exact-match rate. CDM (rendered
  comparison) needs LaTeX + ImageMagick and is left out.
- Reading order: normalized edit distance between the predicted and true order of the matched blocks.
- Layout: typed boxes matched one to one at IoU >= 0.5: precision, recall, F1.
"""

from __future__ import annotations

import functools
import re

import Levenshtein

_TABLE = re.compile(r"<table>.*?</table>", re.S)
_FORMULA = re.compile(r"\$\$(.*?)\$\$", re.S)


def split_markdown(markdown: str) -> dict[str, list[str]]:
    """A page's markdown -> {"tables": [html], "formulas": [latex], "text": [other blocks]}, in order."""
    tables = _TABLE.findall(markdown)
    formulas = [f.strip() for f in _FORMULA.findall(markdown)]
    rest = _FORMULA.sub("\n\n", _TABLE.sub("\n\n", markdown))
    text = [block.strip() for block in rest.split("\n\n") if block.strip()]
    return {"tables": tables, "formulas": formulas, "text": text}


def normalized_edit_distance(predictions: list[str], references: list[str]) -> float:
    """Σ Levenshtein(p, r) / Σ max(len p, len r) over the pairs (0 when both sides are empty everywhere)."""
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    total = sum(max(len(p), len(r)) for p, r in zip(predictions, references))
    return sum(Levenshtein.distance(p, r) for p, r in zip(predictions, references)) / total if total else 0.0


@functools.lru_cache(maxsize=1)
def _teds():
    from table_recognition_metric import TEDS

    return TEDS(), TEDS(structure_only=True)


def teds(prediction: str, reference: str, structure_only: bool = False) -> float:
    """TEDS of two `<table>…</table>` strings (wrapped in the html/body the scorer expects)."""
    full, structure = _teds()
    scorer = structure if structure_only else full
    wrap = "<html><body>{}</body></html>"
    return float(scorer(wrap.format(prediction), wrap.format(reference)))


def _pair_in_order(predicted: list[str], reference: list[str]) -> list[tuple[str, str]]:
    """Each reference item paired with the prediction at the same index ('' when the prediction has fewer):
    a missing or extra table / formula costs its full score."""
    return [(predicted[i] if i < len(predicted) else "", ref) for i, ref in enumerate(reference)]


def page_scores(predictions: list[str], references: list[str]) -> dict:
    """OmniDocBench-style scores of predicted page markdown against the references (same order)."""
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    pred = [split_markdown(p) for p in predictions]
    ref = [split_markdown(r) for r in references]
    text_ned = normalized_edit_distance(["\n\n".join(p["text"]) for p in pred], ["\n\n".join(r["text"]) for r in ref])
    tables = [pair for p, r in zip(pred, ref) for pair in _pair_in_order(p["tables"], r["tables"])]
    formulas = [pair for p, r in zip(pred, ref) for pair in _pair_in_order(p["formulas"], r["formulas"])]
    squash = [(re.sub(r"\s+", "", p), re.sub(r"\s+", "", r)) for p, r in formulas]
    out = {"text_ned": text_ned, "num_pages": len(references), "num_tables": len(tables),
           "num_formulas": len(formulas)}
    if tables:
        out["table_teds"] = sum(teds(p, r) if p else 0.0 for p, r in tables) / len(tables)
        out["table_teds_structure"] = sum(teds(p, r, True) if p else 0.0 for p, r in tables) / len(tables)
    if formulas:
        out["formula_ned"] = normalized_edit_distance([p for p, _ in squash], [r for _, r in squash])
        out["formula_exact"] = sum(p == r for p, r in squash) / len(squash)
    return out


def reading_order_ned(predicted_order: list[int], true_order: list[int]) -> float:
    """Normalized edit distance between two orders of the same blocks (indices), as OmniDocBench scores
    reading order: 0 when identical."""
    if not true_order and not predicted_order:
        return 0.0
    ops = Levenshtein.distance([str(i) for i in predicted_order], [str(i) for i in true_order])
    return ops / max(len(predicted_order), len(true_order))


def box_iou(a, b) -> float:
    ax0, ay0, ax1, ay1 = a
    bx0, by0, bx1, by1 = b
    inter = max(0, min(ax1, bx1) - max(ax0, bx0)) * max(0, min(ay1, by1) - max(ay0, by0))
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    return inter / union if union > 0 else 0.0


def layout_scores(predictions: list[list[tuple]], references: list[list[tuple]], iou: float = 0.5) -> dict:
    """Typed-box detection over pages: each page's (type, box) predictions matched one to one to its references
    of the same type, best IoU first, a match needing IoU >= `iou`; precision / recall / F1 over all blocks,
    and the reading-order NED of the matched blocks (predicted order vs true order)."""
    matched = predicted = truth = 0
    order_distances = []
    for pred, ref in zip(predictions, references):
        predicted += len(pred)
        truth += len(ref)
        pairs = sorted(((box_iou(pb, rb), i, j) for i, (pt, pb) in enumerate(pred) for j, (rt, rb) in enumerate(ref)
                        if pt == rt), reverse=True)
        used_pred, used_ref, match = set(), set(), {}
        for overlap, i, j in pairs:
            if overlap < iou:
                break
            if i not in used_pred and j not in used_ref:
                used_pred.add(i)
                used_ref.add(j)
                match[i] = j
        matched += len(match)
        if len(match) > 1:
            order_distances.append(reading_order_ned([match[i] for i in sorted(match)], sorted(match.values())))
    precision, recall = matched / max(1, predicted), matched / max(1, truth)
    return {"layout_precision": precision, "layout_recall": recall,
            "layout_f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
            "reading_order_ned": sum(order_distances) / len(order_distances) if order_distances else 0.0,
            "blocks_predicted": predicted, "blocks_true": truth}
