"""`mmspec batch`: manifests in every pipeline's input terms, outputs independent of the process count and the
batch size, atomic writes and resume after kill -9, statistics summed over runs, errors before any work."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmspec.common import cli

pytestmark = pytest.mark.e2e

# One CPU thread in every run compared byte for byte: the kernels' float rounding depends on the thread
# count, and with several threads on a loaded machine MKL may use fewer than asked.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_manifest(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def batch(*args) -> int:
    return cli.main(["batch", *map(str, args), "--quiet"])


def outputs(out: Path) -> dict[str, bytes]:
    """Every sample output and record, by file name (the run logs and summary hold timings, so not those)."""
    return {p.name: p.read_bytes() for p in sorted((out / "samples").iterdir())} | \
        {"manifest.jsonl": (out / "manifest.jsonl").read_bytes()}


def asr_clips(n: int) -> list[dict]:
    from mmspec.speech.data import load_test_set

    return [{"audio": row["audio"]} for row in load_test_set()[:n]]


def test_image_outputs_do_not_depend_on_process_count_or_batch_size(tmp_path, one_thread):
    """Greedy: sampled images are equal too as long as float rounding does not depend on the batch's shape,
    which CPU kernels do not promise (see mmspec.common.batch); the per-row generators are tested exactly on
    tiny models in test_continuous_batching."""
    manifest = write_manifest(tmp_path / "labels.jsonl", [{"class_label": 3}, {"class_label": 8, "id": "eight"}])
    greedy = ["--set", "temperature=0"]
    assert batch("lantern", "--inputs", manifest, "--out", tmp_path / "one", "--batch-size", 2, *greedy) == 0
    assert batch("lantern", "--inputs", manifest, "--out", tmp_path / "batch1", "--batch-size", 1, *greedy) == 0
    launched = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "-m", "mmspec",
         "batch", "lantern", "--inputs", str(manifest), "--out", str(tmp_path / "two"), "--quiet", *greedy],
        env=ENV, capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert len(list((tmp_path / "two" / "runs").glob("*.rank1.jsonl"))) == 1  # really two processes
    single = outputs(tmp_path / "one")
    assert set(single) == {"000000.png", "000000.json", "eight.png", "eight.json", "manifest.jsonl"}
    assert outputs(tmp_path / "two") == single
    assert outputs(tmp_path / "batch1") == single
    record = json.loads(single["eight.json"])
    assert record["inputs"] == {"class_label": 8} and record["seed"] == 1  # default seed: --seed + line index
    assert record["stats"]["target_forwards"] < 256  # lantern's own count for this sample (256 codes)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["samples"] == 2 and [r["samples"] for r in summary["runs"]] == [1, 1]
    one_row = json.loads((tmp_path / "batch1" / "summary.json").read_text())  # one row, refilled once
    assert one_row["continuous_batching"] and one_row["compute"]["extra"]["admitted_rows"] == 1


def test_asr_kill_9_mid_call_then_resume_redoes_only_unfinished_samples_and_equals_an_uninterrupted_run(
        tmp_path, one_thread):
    """Samples are written as their rows finish, not when the decode call returns: a kill -9 inside a call keeps
    what finished, the resume leaves those files untouched, redoes the rest (and a file cut short), and the
    result equals an uninterrupted run byte for byte."""
    manifest = write_manifest(tmp_path / "clips.jsonl", asr_clips(10))
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "straight", "--batch-size", 4) == 0
    out = tmp_path / "killed"
    # --batch-size 2: one call of up to 16 samples (REFILL_WINDOW batches) holds all 10
    process = subprocess.Popen([sys.executable, "-m", "mmspec", "batch", "ctc_draft", "--inputs", str(manifest),
                                "--out", str(out), "--batch-size", "2", "--quiet"], env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while len(list(out.glob("samples/*.json"))) < 3 and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    killed_log = next(out.glob("runs/*.jsonl"))
    lines = [json.loads(x) for x in killed_log.read_text().splitlines() if x.endswith("}")]
    assert lines and all("sample" in line for line in lines), "killed after its call ended: not mid-call"
    records = sorted(out.glob("samples/*.json"))
    assert 3 <= len(records) < 10 and not (out / "manifest.jsonl").exists()
    finished = {p.with_suffix(".txt") for p in records if (p.with_suffix(".txt")).exists()}
    cut = sorted(finished)[0]
    cut.write_text("tru")  # a file cut short: its digest no longer matches the record, so it is redone
    kept = {p: p.stat().st_mtime_ns for p in sorted(finished - {cut}) + [r for r in records if r.stem != cut.stem]}
    assert batch("ctc_draft", "--inputs", manifest, "--out", out, "--batch-size", 3) == 0
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished samples are not redone
    assert outputs(out) == outputs(tmp_path / "straight")
    assert not list(out.glob("samples/.*"))  # no temporary file left behind
    summary = json.loads((out / "summary.json").read_text())
    first, second = sorted(summary["runs"], key=lambda r: r["log"] != killed_log.name)  # the killed run first
    assert first["samples"] == len(lines) and first["unfinished_calls"] == 1
    assert second["samples"] == 10 - len(kept) // 2 and "unfinished_calls" not in second
    assert summary["samples"] == 10 and summary["per_sample"]["samples_with_own_statistics"] == 10
    assert summary["continuous_batching"]  # ctc_draft on asr-tiny refills utterances as they finish


def test_asr_with_two_processes_and_on_ray_in_local_mode_equals_one_process(tmp_path, one_thread):
    manifest = write_manifest(tmp_path / "clips.jsonl", asr_clips(5))
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "one", "--batch-size", 5) == 0
    for engine, launcher in (("local", ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]),
                             ("ray", [])):
        run = subprocess.run([sys.executable, *launcher, "-m", "mmspec", "batch", "ctc_draft", "--inputs",
                              str(manifest), "--out", str(tmp_path / engine), "--batch-size", "2", "--engine", engine,
                              "--ray-workers", "2", "--quiet"], env=ENV, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        assert outputs(tmp_path / engine) == outputs(tmp_path / "one"), engine
    assert len(list((tmp_path / "local" / "runs").glob("*.rank1.jsonl"))) == 1
    assert [r["samples"] for r in json.loads((tmp_path / "ray" / "summary.json").read_text())["runs"]] == [5]


def test_a_resumed_run_removes_what_a_killed_write_left_half_done(tmp_path):
    """A kill -9 inside `write_atomic` leaves its temporary file; the next run over the folder removes it (and
    the finished samples stay as they are)."""
    manifest = write_manifest(tmp_path / "m.jsonl", [{"prompt": "the model"}, {"prompt": "a cat"}])
    args = ["speculative", "--inputs", manifest, "--out", tmp_path / "out", "--set", "max_new_tokens=4"]
    assert batch(*args) == 0
    before = outputs(tmp_path / "out")
    for stale in (".000001.4242.tmp.txt", ".000001.4242.tmp.json", ".000000.99.tmp"):
        (tmp_path / "out" / "samples" / stale).write_bytes(b"")
    assert batch(*args) == 0
    assert not list((tmp_path / "out" / "samples").glob(".*"))
    assert {k: v for k, v in outputs(tmp_path / "out").items() if not k.startswith(".")} == before


@pytest.mark.parametrize("model, line, settings, suffix", [
    ("text-tiny", {"prompt": "the model"}, ["max_new_tokens=6"], ".txt"),
    ("tts-tiny", {"text": "hello there"}, ["max_new_frames=6"], ".wav"),
    ("doc-tiny", {"page": "PAGE"}, ["max_new_tokens=6"], ".md"),
])
def test_every_modality_batches_its_own_inputs(tmp_path, model, line, settings, suffix):
    if line.get("page") == "PAGE":
        from mmspec.docs_parse.pages import load_held_out_set

        line = {"page": load_held_out_set()[0]["image"]}
    manifest = write_manifest(tmp_path / "m.jsonl", [line, {**line, "id": "again", "seed": 7}])
    args = ["ar", "--model", model, "--inputs", manifest, "--out", tmp_path / "out", "--batch-size", 2]
    with pytest.warns(UserWarning) if model != "text-tiny" else _nothing():  # cut short by the tiny limits
        assert batch(*args, *[x for s in settings for x in ("--set", s)]) == 0
    records = [json.loads(x) for x in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["000000", "again"] and records[1]["seed"] == 7
    assert all((tmp_path / "out" / r["output"]).suffix == suffix for r in records)
    if model == "tts-tiny":  # its decode rows are frames, not texts: the record carries its batch's statistics
        assert all(r["stats"]["of"] == "batch" and r["stats"]["batch_size"] == 2 for r in records)
    else:
        assert all(r["stats"]["target_forwards"] >= 1 for r in records)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("lines, message", [
    (['{"class_label": 1}', "{not json"], "line 2: not valid JSON"),
    (['{"class_label": 1, "id": "a/b"}'], "line 1: field 'id' must be a string of letters"),
    (['{"class_label": 1, "id": "x"}', '', '{"class_label": 2, "id": "x"}'], "line 3: field 'id' 'x' repeats line 1"),
    (['{"class_label": 1, "seed": -1}'], "line 1: field 'seed' must be an int"),
    (['{"class_label": 1}', '{"class_label": 99}'], "line 2: field 'class_label' must be an int in [0, 10), got 99"),
    (['{"prompt": "a cat"}'], "line 1: unknown field 'prompt'; a ARImagePipeline line takes 'class_label'"),
    (['{"class_label": 1}', '{}'], "line 2: field 'class_label' is missing"),
])
def test_a_bad_manifest_line_is_one_error_naming_line_and_field_before_any_work(tmp_path, capsys, lines, message):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    assert batch("ar", "--inputs", manifest, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"mmspec batch: error: m.jsonl {message}" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_bad_files_and_a_changed_job_are_refused_without_touching_what_is_written(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"audio": "missing.wav"}])
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out") == 2
    assert f"m.jsonl line 1: field 'audio': no such file {str(tmp_path / 'missing.wav')!r}" in capsys.readouterr().err
    (tmp_path / "image.wav").write_bytes(b"\x89PNG not audio")
    write_manifest(manifest, [{"audio": "image.wav"}])
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out") == 2
    assert "is not an audio file soundfile can read" in capsys.readouterr().err
    write_manifest(manifest, asr_clips(2))
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out") == 0
    before = outputs(tmp_path / "out")
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out", "--set", "mode=relaxed") == 2
    assert "holds a batch with another plugin_config" in capsys.readouterr().err
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out", "--batch-size", 0) == 2
    assert "--batch-size must be an int >= 1, got 0" in capsys.readouterr().err
    assert outputs(tmp_path / "out") == before


def test_every_bad_manifest_line_is_named_in_one_error_before_any_work(tmp_path, capsys):
    (tmp_path / "image.wav").write_bytes(b"\x89PNG not audio")
    good = asr_clips(1)[0]
    manifest = write_manifest(tmp_path / "m.jsonl", [{"audio": "missing.wav"}, good, {"audio": "image.wav"}, good])
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err == (f"mmspec batch: error: m.jsonl line 1: field 'audio': no such file {str(tmp_path / 'missing.wav')!r}"
                   f"; m.jsonl line 3: field 'audio': {str(tmp_path / 'image.wav')!r} is not an audio file soundfile "
                   "can read (wav, flac, ogg, mp3)\n")
    assert not (tmp_path / "out").exists()  # nothing was generated, or even set up
    # Syntax errors too are all named at once.
    (tmp_path / "m.jsonl").write_text('{"audio": 1\n{}\n[2]\n')
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "out") == 2
    assert capsys.readouterr().err == ("mmspec batch: error: m.jsonl line 1: not valid JSON (Expecting ',' "
                                       "delimiter at column 12); m.jsonl line 3: must be a JSON object, got list\n")


def test_a_manifest_with_many_bad_lines_names_the_first_ten_and_counts_the_rest(tmp_path):
    from mmspec.common.batch import check_inputs, read_manifest

    class Labels:  # only the manifest check runs: no model is needed
        batch_fields = {"label": "an int >= 0"}

        def batch_input(self, record, base_dir):
            if record.get("label", -1) < 0:
                raise ValueError(f"field 'label' must be an int >= 0, got {record.get('label')!r}")
            return record["label"]

    path = write_manifest(tmp_path / "m.jsonl", [{"label": -i} for i in range(13)])  # line 1 is label 0: good
    samples = read_manifest(path, seed=0)
    with pytest.raises(ValueError) as caught:
        check_inputs(Labels(), samples, path)
    named = str(caught.value).split("; ")
    assert named[0] == "m.jsonl line 2: field 'label' must be an int >= 0, got -1"
    assert [n.split(":")[0] for n in named[:10]] == [f"m.jsonl line {n}" for n in range(2, 12)]
    assert named[10:] == ["and 2 more bad lines"] and "\n" not in str(caught.value)
    assert [s.input for s in samples[:1]] == [0]


def test_batch_progress_is_a_line_per_batch_off_a_terminal_and_nothing_when_quiet(tmp_path, capsys, monkeypatch):
    from mmspec.common import batch as batch_module

    monkeypatch.setattr(batch_module, "REFILL_WINDOW", 1)  # a decode call per --batch-size samples
    manifest = write_manifest(tmp_path / "m.jsonl", asr_clips(2))
    assert cli.main(["batch", "ctc_draft", "--inputs", str(manifest), "--out", str(tmp_path / "out"),
                     "--batch-size", "1"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if ": batch " in line]
    assert [line.split(",")[0] for line in lines] == ["mmspec batch: batch 1/2: 1/2 samples",
                                                      "mmspec batch: batch 2/2: 2/2 samples"]
    assert all(line.endswith(" s") and "\r" not in line for line in lines)
    assert batch("ctc_draft", "--inputs", manifest, "--out", tmp_path / "quiet", "--batch-size", 1) == 0
    assert capsys.readouterr().err == ""


def test_a_terminal_still_gets_the_tqdm_bar(capsys):
    import io

    from mmspec.common.pipeline import BatchProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    with BatchProgress("mmspec batch", 2, 5, "sample", config={"file": screen}) as progress:
        progress.update(3)
        progress.update(2)
    assert "\r" in screen.getvalue() and "5/5" in screen.getvalue() and ": batch " not in screen.getvalue()
    with BatchProgress("mmspec batch", 2, 5, "sample", config={"file": screen, "disable": True}) as progress:
        progress.update(5)
    plain = io.StringIO()  # not a terminal: lines, on the stream tqdm would have drawn on
    with BatchProgress("parsing", 2, 5, "page", config={"file": plain}, per_batch=True) as progress:
        progress.update(3)
    assert plain.getvalue().startswith("parsing: batch 1/2: 3/5 pages, ") and capsys.readouterr().err == ""
