"""A user's mistakes on the command line and in `load_plugin` are one line naming the argument and what is
allowed; what can be checked before a model loads is (the model factory is never called)."""

from pathlib import Path

import pytest

from mmspec import load_plugin
from mmspec.common import cli
from mmspec.common import loading


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(loading, "load_bundled_pipeline", refuse)


# Each mistake the registry, the config metadata, a pipeline's spec or the file system can tell: one line,
# before any model loads (and, in a fresh interpreter, before torch is imported: the next test).
EARLY_MISTAKES = [
    (["generate", "ar", "--num", "0"], "--num must be an int >= 1, got 0"),
    (["generate", "ar", "--batch-size", "0"], "--batch-size must be an int >= 1, got 0"),
    (["generate", "ar", "--out", "no_such_folder/x.png"], "the folder"),
    (["generate", "ar", "--num", "100000000"], "--num must be at most 256 (`mmspec generate` draws every image into "
                                               "one grid picture; `mmspec batch` writes any number, one file each)"),
    (["generate", "ctc_draft", "--num", "500"], "--num must be at most 200 (the held-out clips; give --audio), "
                                                "got 500"),
    (["generate", "rvq_spec", "--num", "41"], "--num must be at most 40 (the held-out sentences; give --text)"),
    (["generate", "ptp", "--num", "49"], "--num must be at most 48 (the held-out pages; give --page), got 49"),
    (["generate", "ar", "--seed", "-1"], "--seed must be an int in [0, 2**32 - 1], got -1"),
    (["bench", "ar", "--seed", "4294967296"], "--seed must be an int in [0, 2**32 - 1], got 4294967296"),
    (["batch", "ar", "--inputs", "m.jsonl", "--out", "o", "--seed", "-1"], "--seed must be an int in [0, 2**32 - 1]"),
    (["generate", "ar", "--out", "grid.wav"], "--out 'grid.wav': a ARImagePipeline writes .png, .jpg, .jpeg, .webp; "
                                              "got .wav"),
    (["generate", "ar", "--model", "tts-tiny", "--out", "a.png"], "a TTSPipeline writes .wav; got .png"),
    (["generate", "ctc_draft", "--audio", "missing.wav"], "1 input cannot be used: --audio 'missing.wav': no such file"),
    (["generate", "ctc_draft", "--audio", "image.png", "--audio", "missing.wav", "--audio", "full"],
     "3 inputs cannot be used: --audio 'image.png': not an audio file soundfile can read (wav, flac, ogg, mp3); "
     "--audio 'missing.wav': no such file; --audio 'full': a folder, not a file"),
    (["generate", "ptp", "--page", "missing.png", "--page", "notes.txt"],
     "2 inputs cannot be used: --page 'missing.png': no such file; --page 'notes.txt': neither a PDF nor an image"),
    (["generate", "ctc_draft", "--set", "nope=1"], "unknown --set key 'nope'; pipeline settings: ['max_batch_size', "
                                                   "'max_new_tokens', 'temperature'], plugin 'ctc_draft' config: "),
    (["generate", "lantern", "--set", "delta=2"], "LanternConfig.delta must be a number in [0.0, 1.0], got 2"),
    (["generate", "ctc_draft", "--set", "tau=-1"], "CTCDraftConfig.tau must be a number >= 0, None (gate off) or "
                                                   "'auto', got -1"),
    (["generate", "ar", "--set", "temperature=-1"], "ImageCallSettings.temperature must be a number in [0.0, inf), "
                                                    "got -1"),
    (["generate", "ar", "--set", "guidance_scale=0.5"], "ImageCallSettings.guidance_scale must be a number in "
                                                        "[1.0, inf), got 0.5"),
    (["generate", "ptp", "--set", "mode=pages"], "DocCallSettings.mode must be one of ['page', 'layout', "
                                                 "'layout+regions', 'regions'], got 'pages'"),
    (["generate", "ctc_draft", "--page", "p.png"], "unrecognized arguments ['--page', 'p.png'] for a ASRPipeline; "
                                                   "its input flags: --audio"),
    (["generate", "ctc_draft", "--model", "llamagen-tiny"], "model must be one of ['asr-tiny', 'tts-tiny', "
                                                            "'whisper-tiny-random'] for a speech plugin"),
    (["generate", "ar", "--model", "no-such-model"], "model must be one of"),
    (["generate", "ar", "--model", "empty_folder/"], "not a saved mmspec pipeline"),
    (["bench", "ctc_draft", "--set", "test_set=clean"], "ASRBenchSettings.test_set must be one of ['in_domain', "
                                                        "'out_of_domain', 'foreign', 'noise'], got 'clean'"),
    (["bench", "ar", "--set", "num_draft_tokens=3"], "unknown --set key 'num_draft_tokens'"),
    (["plan-tree", "eagle", "--set", "num_draft_tokens=0"], "EagleConfig.num_draft_tokens must be an int in [1, 64]"),
    (["batch", "ar", "--inputs", "missing.jsonl", "--out", "o"], "--inputs: no such manifest file"),
    (["batch", "ar", "--inputs", "missing.jsonl", "--out", "o", "--batch-size", "0"], "--batch-size must be"),
    (["batch", "ssd", "--inputs", "m.jsonl", "--out", "o", "--set", "num_draft_tokens=-1"], "SSDConfig.num_draft_"),
    (["train-head", "lantern", "--out", "h", "--steps", "0"], "--steps must be an int >= 1, got 0"),
    (["train-head", "sjd", "--out", "h"], "plugin 'sjd' has no weights to train; plugins with a trainer: eagle, "
                                          "lantern, lantern++"),
    (["train-head", "lantern", "--out", "nodir/h"], "the folder"),
    (["train-head", "lantern", "--out", "full"], "'full' exists and is not an empty folder; choose another or pass "
                                                 "--overwrite"),
]


def mistake_files(folder: Path) -> None:
    (folder / "full").mkdir()
    (folder / "full" / "config.json").write_text("{}")
    (folder / "empty_folder").mkdir()
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n not audio at all")
    (folder / "notes.txt").write_text("not a page")


@pytest.mark.parametrize("args, message", EARLY_MISTAKES, ids=[" ".join(a) for a, _ in EARLY_MISTAKES])
def test_bad_arguments_fail_before_any_model_loads(no_model, capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    mistake_files(tmp_path)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_pipeline_without_a_spec_still_refuses_num_beyond_its_held_out_set():
    """`cli_held_out`, for pipelines registered without a spec (their --num is known only once loaded)."""
    from mmspec.common.pipeline import Pipeline

    with pytest.raises(ValueError, match="--num must be at most 2 \\(the held-out clips\\) without --audio, got 3"):
        Pipeline.cli_held_out([1, 2], 3, "clips", "--audio")


def test_cuda_that_is_not_there_is_one_line(no_model, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for command in (["generate", "ar", "--device", "cuda"], ["bench", "ar", "--device", "cuda"]):
        assert cli.main(command) == 2
        assert "--device cuda: no CUDA device is visible here" in capsys.readouterr().err


def test_a_bad_saved_folder_fails_at_load_plugin(tmp_path):
    with pytest.raises(ValueError, match="head_path '/nope' is not a saved folder \\(no such folder\\)"):
        load_plugin("lantern", head_path="/nope")
    with pytest.raises(ValueError, match="heads_path .* is not a saved folder \\(no config.json there\\)"):
        load_plugin("ssd", heads_path=str(tmp_path))


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("mmspec ")


LIGHT_COMMANDS = [["list"], ["list", "--modality", "vision"], ["list", "--markdown"], ["--help"], ["--version"],
                  ["bench", "--help"], ["generate", "--help"], ["batch", "--help"], ["bench", "lanter"], ["generate", "nope"],
                  ["generate", "ctc_draft", "--help"], ["generate", "ptp", "--model", "doc-tiny", "--help"]]


# `train-head` looks the plugin's trainer up on its class (torch): still before any model loads (above).
TORCH_FREE = LIGHT_COMMANDS + [args for args, _ in EARLY_MISTAKES if args[:2] != ["train-head", "sjd"]]


@pytest.mark.parametrize("args", TORCH_FREE, ids=[" ".join(a) for a in TORCH_FREE])
def test_light_commands_and_early_mistakes_do_not_import_torch(args, tmp_path):
    """In a fresh interpreter: listing, help (a pipeline's input flags included), the version and every early
    mistake answer without loading torch (which takes seconds), so a typo is reported at once."""
    import subprocess
    import sys

    mistake_files(tmp_path)
    code = ("import sys\nfrom mmspec.common.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    if args[:1] == ["list"]:
        assert "lantern" in done.stdout and ("ctc_draft" in done.stdout) == ("--modality" not in args)
    if "lanter" in args or "nope" in args:
        assert "error: unknown plugin" in done.stderr and "available: ar," in done.stderr
    if args[:2] == ["generate", "ctc_draft"] and "--help" in args:
        assert "--audio AUDIO" in done.stdout and "--num NUM" in done.stdout
    if args[:2] == ["generate", "ptp"] and "--help" in args:
        assert "--page PAGE" in done.stdout


def test_list_plugins_imports_no_plugin():
    """`list_plugins()` in Python answers from the declared table, as `mmspec list` does."""
    import subprocess
    import sys

    code = ("import sys\nfrom mmspec import list_plugins\nnames = list_plugins()\nassert 'ptp' in names, names\n"
            "assert 'torch' not in sys.modules and not [m for m in sys.modules if m.endswith('.plugin')]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_train_head_never_writes_over_shipped_weights_unless_asked(no_model, capsys):
    from mmspec.plugins.lantern import BUNDLED_EAGLE_HEAD

    assert cli.main(["train-head", "lantern", "--out", str(BUNDLED_EAGLE_HEAD)]) == 2
    assert "is inside the weights mmspec ships" in capsys.readouterr().err
    assert cli.main(["train-head", "lantern", "--out", str(BUNDLED_EAGLE_HEAD), "--overwrite"]) == 2
    assert "--overwrite-shipped" in capsys.readouterr().err


def test_generate_uses_the_loaded_models_own_defaults(tmp_path):
    """The spec checks `--set` before loading, but the call runs with the loaded pipeline's defaults: the tiny
    random Whisper stops at its own max_new_tokens (48), not the ASR class's 200."""
    import json

    out = tmp_path / "t.json"
    assert cli.main(["generate", "ctc_draft", "--model", "whisper-tiny-random", "--num", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["stats"]["tokens"] <= 48
