"""Calibrate `ctc_draft`'s gate on training utterances and report how well each statistic separates right
from wrong CTC hypotheses on the held-out sets (AUROC), and what the calibrated gate does there.

    python examples/calibrate_ctc_gate.py --data runs/asr_open_data/train.pt --num-train 800

The threshold of each statistic is the largest at which at most `--max-wrong` of the gated *training*
hypotheses are wrong; held-out sets only ever see the threshold. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import random

import torch

from mmspec.plugins.ctc_draft.calibrate import STATISTICS, auroc, calibrate_tau, gate_outcome, gate_records
from mmspec.speech.data import bench_test_set
from mmspec.speech.pipeline import bundled_pipeline, load_audio, pad_waves
from mmspec.speech.recognizer import EncodedSpeech


@torch.no_grad()
def training_records(recognizer, data_path: str, count: int, batch: int = 16, seed: int = 0) -> list[dict]:
    """Gate records of `count` random training utterances, from their stored log-mel features."""
    data = torch.load(data_path)
    offsets = data["offsets"]
    picks = random.Random(seed).sample(range(len(data["texts"])), count)
    model, records = recognizer.model, []
    for start in range(0, count, batch):
        rows = picks[start:start + batch]
        feats = [data["feats"][offsets[i]:offsets[i + 1]].float() for i in rows]
        lengths = torch.tensor([f.shape[0] for f in feats])
        x = (torch.nn.utils.rnn.pad_sequence(feats, batch_first=True) - model.feature_mean) / model.feature_std
        out = model.encode_features(x, lengths)
        records += gate_records(recognizer, EncodedSpeech(out.ctc_logits, out.lengths, out),
                                [data["texts"][i] for i in rows])
    return records


@torch.no_grad()
def test_set_records(recognizer, name: str, batch: int = 16) -> list[dict]:
    rows, records = bench_test_set(name), []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        waves, num_samples = pad_waves([load_audio(r["audio"]) for r in chunk])
        records += gate_records(recognizer, recognizer.encode(waves, num_samples), [r["text"] for r in chunk])
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="runs/asr_open_data/train.pt")
    parser.add_argument("--num-train", type=int, default=800)
    parser.add_argument("--max-wrong", type=float, default=0.1, help="wrong share allowed among gated hypotheses")
    args = parser.parse_args(argv)

    recognizer = bundled_pipeline().recognizer
    train = training_records(recognizer, args.data, args.num_train)
    held_out = {name: test_set_records(recognizer, name) for name in ("in_domain", "out_of_domain")}
    print(f"wrong CTC hypotheses: training {sum(r['wrong'] for r in train)}/{len(train)}, "
          + ", ".join(f"{k} {sum(r['wrong'] for r in v)}/{len(v)}" for k, v in held_out.items()))
    print("\n| statistic | AUROC in-domain | AUROC out-of-domain | τ (training, ≤ "
          f"{args.max_wrong:.0%} wrong) | gated / wrong among gated, in-domain | same, out-of-domain |")
    print("|---|---|---|---|---|---|")
    for statistic in STATISTICS:
        tau = calibrate_tau(train, statistic, args.max_wrong)
        aurocs = [auroc([r[statistic] for r in v], [r["wrong"] for r in v]) for v in held_out.values()]
        outcomes = [gate_outcome(v, statistic, tau) for v in held_out.values()]
        print(f"| {statistic} | {aurocs[0]:.3f} | {aurocs[1]:.3f} | {'—' if tau is None else f'{tau:.3f}'} | "
              + " | ".join(f"{o['gated']:.0%} / {o['wrong_among_gated']:.0%}" for o in outcomes) + " |")


if __name__ == "__main__":
    main()
