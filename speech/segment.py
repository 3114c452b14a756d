"""Long-form audio: split a recording into utterances a recognizer can take, at its pauses.

A model trained on single sentences (the bundled `asr-tiny`) ends its transcript after the first sentence
of a longer clip, and a fixed-window encoder (Whisper's 30 s) drops what does not fit. So audio is cut

- at every pause of at least `pause_s` (frames quieter than the clip's noise floor allows), and
- wherever a piece is still longer than `max_s`, at its quietest frame in the second half of the window.

Pieces that hold no frame above the silence threshold are dropped (leading and trailing silence, gaps).
Energy, not a learned VAD: the bundled data has 18-40 dB SNR, where frame energy separates speech from
pauses; cuts land in silence, so no word is split and no overlap or merge step is needed.
"""

from __future__ import annotations

import torch

FRAME = 400  # 25 ms at 16 kHz
HOP = 160  # 10 ms


def frame_energy(wave: torch.Tensor) -> torch.Tensor:
    """[F] RMS of 25 ms frames every 10 ms (a clip shorter than a frame is one frame)."""
    padded = torch.nn.functional.pad(wave.float(), (0, max(0, FRAME - wave.numel())))
    return padded.unfold(0, FRAME, HOP).pow(2).mean(1).sqrt()


def silence_threshold(energy: torch.Tensor) -> float:
    """Frames below this are silence: 4x the noise floor (10th-percentile frame), at least 2 % of the
    loudest frame (a clean clip has a floor near zero)."""
    return max(4 * float(torch.quantile(energy, 0.1)), 0.02 * float(energy.max()), 1e-5)


def split_utterances(wave: torch.Tensor, sample_rate: int, max_s: float | None, pause_s: float | None
                     ) -> list[tuple[int, int]]:
    """(start, end) sample ranges of the utterances in `wave` [N], in order; [] when it holds no sound."""
    energy = frame_energy(wave)
    silent = energy < silence_threshold(energy)
    frames = energy.numel()
    cuts = []
    if pause_s:
        need = max(1, round(pause_s * sample_rate / HOP))
        run_start = None
        for i, quiet in enumerate(silent.tolist() + [False]):
            if quiet and run_start is None:
                run_start = i
            elif not quiet and run_start is not None:
                if i - run_start >= need and run_start > 0 and i < frames:  # inside the clip, not at its edges
                    cuts.append((run_start + i) // 2)
                run_start = None
    bounds = [0] + cuts + [frames]
    pieces = [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if max_s:
        limit = max(2, int(max_s * sample_rate / HOP))
        split = []
        for a, b in pieces:
            while b - a > limit:
                window = energy[a + limit // 2: a + limit]
                cut = a + limit // 2 + int(window.argmin())
                split.append((a, cut))
                a = cut
            split.append((a, b))
        pieces = split
    out = [(a * HOP, min(wave.numel(), b * HOP + FRAME - HOP)) for a, b in pieces if not bool(silent[a:b].all())]
    return out
