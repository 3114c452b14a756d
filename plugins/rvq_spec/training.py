"""Self-distillation of the RVQ offsets on a depth decoder's own states.

Frames come from the TTS model itself (its own sampled codes at the deployed settings, `collect_frames`):
for each, the backbone state that feeds the depth decoder and the frame's K codes. The depth decoder runs
teacher-forced over them once (`depth_states`), giving its state at positions 1 … K−1; position p's own
head gives the target distribution of level p. The offsets (and nothing else) are trained so that level
q+d's head on state q + o_d matches level q+d's target distribution:

    loss = mean over (frame, q, d) of KL( softmax(target_{q+d} / T) ‖ softmax(head_{q+d}(h_q + o_d) / T) )

with T the deployed temperature (objective "kl"), or 1 − Σ min(p̃, q̃) over the processed (truncated,
renormalised) pair, i.e. one minus the expected acceptance itself (objective "tv"; its gradient flows inside
the top-k set only). Validation reports the acceptance either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmspec.common.logits import LogitsPipeline
from mmspec.common.plugin import Plugin
from mmspec.common.structure import RVQFrames

from .drafter import RVQOffsets


class FrameRecorder(Plugin):
    """Plain AR that also keeps, for every frame the depth decoder decodes, the backbone state it was given
    (`DecodeRequest.conditioning`) and the frame's codes. Not registered: attach it with `with_plugin`."""

    name = "ar (recording frames)"
    requires = RVQFrames

    def __init__(self):
        super().__init__()
        self.hidden: list[torch.Tensor] = []  # [G, H] per decoded frame batch
        self.codes: list[torch.Tensor] = []  # [G, K]

    def build_decoder(self, pipeline, request):
        from mmspec.common.registry import get_plugin_class

        inner = get_plugin_class("ar")().build_decoder(pipeline, request)
        recorder = self

        class RecordingDecoder:
            def generate(self, input_ids, attention_mask=None, **kwargs):
                out = inner.generate(input_ids, attention_mask, **kwargs)
                recorder.hidden.append(request.conditioning.float().cpu())
                recorder.codes.append(torch.cat([input_ids[:, -1:], out.sequences], 1).cpu())
                return out

        return RecordingDecoder()

    def frames(self) -> dict:
        return {"hidden": torch.cat(self.hidden), "codes": torch.cat(self.codes)}


def collect_frames(pipeline, texts: list[str], seed: int, batch_size: int = 16, **settings) -> dict:
    """{"hidden": [N, H_backbone], "codes": [N, K]} of every frame the pipeline speaks for `texts` (text i
    sampled with generator seed + i, so the collection is deterministic and independent of batching)."""
    import warnings

    recorder = FrameRecorder()
    pipe = pipeline.with_plugin(recorder)
    pipe.set_progress_bar_config(disable=True)
    generators = [torch.Generator().manual_seed(seed + i) for i in range(len(texts))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # texts that hit max_new_frames still give valid frames
        pipe(texts, generator=generators, batch_size=batch_size, **settings)
    return recorder.frames()


@torch.no_grad()
def depth_states(make_target, backbone_hidden: torch.Tensor, codes: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """[N, K−1, D] the depth decoder's states at positions 1 … K−1, teacher-forced on the frames' codes.

    make_target(backbone_hidden [n, H]) -> an `RVQDepthModel` for those rows (the same adapter decoding uses).
    """
    states = []
    depth = codes.shape[1]
    for start in range(0, codes.shape[0], batch_size):
        hidden, frame = backbone_hidden[start:start + batch_size], codes[start:start + batch_size]
        target = make_target(hidden)
        rows = frame.shape[0]
        state, _ = target.prefill(torch.zeros(rows, 1, dtype=torch.long, device=target.device))
        positions = torch.arange(1, depth, device=target.device).expand(rows, -1)
        out = target.forward(state, frame[:, :-1].to(target.device), positions, output_hidden=True)
        states.append(out.hidden.float().cpu())
    return torch.cat(states)


def _pairs(depth: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (source level q, distance d) a drafter uses for K = depth levels: q in 1..K−2, q + d <= K−1."""
    pairs = [(q, d) for q in range(1, depth - 1) for d in range(1, depth - q)]
    table = torch.tensor(pairs, device=device)
    return table[:, 0], table[:, 1]


def offset_losses(target, offsets: RVQOffsets | None, states: torch.Tensor, temperature: float = 0.9,
                  logits: LogitsPipeline | None = None, objective: str = "kl") -> dict:
    """Distillation loss and acceptance of one batch of frames.

    target: an `RVQDepthModel` (only its `code_logits`, the frozen heads, are used); states [M, K−1, D] from
    `depth_states`. objective: "kl" (the tempered full distributions) or "tv" (1 − acceptance: the
    total-variation distance of the processed pair, differentiable inside the top-k set). Returns {"loss",
    "acceptance": [K−2] mean Σ min(p̃, q̃) per draft distance under `logits` (default: the deployed temperature
    0.9, top-k 50), "kl": [K−2] mean KL per distance}.
    """
    if objective not in ("kl", "tv"):
        raise ValueError(f"objective must be 'kl' or 'tv', got {objective!r}")
    logits = logits or LogitsPipeline(temperature, 50, 1.0)
    batch, positions, width = states.shape
    depth = positions + 1
    source, distance = _pairs(depth, states.device)
    level = source + distance
    pairs = source.numel()
    # Rows: every frame x every (q, d) pair.
    base = states[:, source - 1]  # [M, P, D] state at the source level's position
    shift = 0 if offsets is None else offsets.vectors(source, distance)[None].to(base.dtype)
    flat_level = level.repeat(batch)
    codebook = target.codebook_size
    draft = target.code_logits((base + shift).reshape(-1, width), flat_level)[:, :codebook]
    with torch.no_grad():
        teacher = target.code_logits(states[:, level - 1].reshape(-1, width), flat_level)[:, :codebook]
    log_p = F.log_softmax(teacher / temperature, -1)
    log_q = F.log_softmax(draft / temperature, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).view(batch, pairs)
    target_probs = logits.probs(teacher)
    overlap = torch.minimum(target_probs, logits.probs(draft)).sum(-1).view(batch, pairs)
    with torch.no_grad():
        by_distance = torch.stack([overlap.detach()[:, distance == d].mean() for d in range(1, depth - 1)])
        kl_by_distance = torch.stack([kl.detach()[:, distance == d].mean() for d in range(1, depth - 1)])
    loss = kl.mean() if objective == "kl" else 1 - overlap.mean()
    return {"loss": loss, "acceptance": by_distance, "kl": kl_by_distance}
