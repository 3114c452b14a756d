"""A user's mistakes on the command line and in `load_plugin` are one line naming the argument and what is
allowed; what can be checked before a model loads is (the model factory is never called)."""

import pytest

from mmspec import load_plugin
from mmspec.common import cli
from mmspec.common.plugin import Plugin


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(Plugin, "default_pipeline", classmethod(refuse))


@pytest.mark.parametrize("args, message", [
    (["generate", "ar", "--num", "0"], "--num must be an int >= 1, got 0"),
    (["generate", "ar", "--batch-size", "0"], "--batch-size must be an int >= 1, got 0"),
    (["generate", "ar", "--out", "no_such_folder/x.png"], "the folder"),
    (["batch", "ar", "--inputs", "missing.jsonl", "--out", "o"], "--inputs: no such manifest file"),
    (["batch", "ar", "--inputs", "missing.jsonl", "--out", "o", "--batch-size", "0"], "--batch-size must be"),
    (["train-head", "lantern", "--out", "h", "--steps", "0"], "--steps must be an int >= 1, got 0"),
    (["train-head", "sjd", "--out", "h"], "plugin 'sjd' has no weights to train; plugins with a trainer: eagle, "
                                          "lantern, lantern++"),
    (["train-head", "lantern", "--out", "nodir/h"], "the folder"),
    (["train-head", "lantern", "--out", "full"], "'full' exists and is not an empty folder; choose another or pass "
                                                 "--overwrite"),
])
def test_bad_arguments_fail_before_any_model_loads(no_model, capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cuda_that_is_not_there_is_one_line(no_model, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for command in (["generate", "ar", "--device", "cuda"], ["bench", "ar", "--device", "cuda"]):
        assert cli.main(command) == 2
        assert "--device cuda: no CUDA device is visible here" in capsys.readouterr().err


def test_errors_that_need_the_pipeline_come_before_generation(capsys, tmp_path):
    assert cli.main(["generate", "ar", "--out", str(tmp_path / "grid.wav")]) == 2
    assert "a ARImagePipeline writes .png, .jpg, .jpeg, .webp; got .wav" in capsys.readouterr().err
    assert cli.main(["generate", "ctc_draft", "--num", "500"]) == 2
    assert "--num must be at most 200 (the held-out clips) without --audio, got 500" in capsys.readouterr().err
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n not audio at all")
    assert cli.main(["generate", "ctc_draft", "--audio", str(tmp_path / "image.png")]) == 2
    assert "is not an audio file soundfile can read" in capsys.readouterr().err
    assert not list(tmp_path.glob("grid*"))


def test_a_bad_saved_folder_fails_at_load_plugin(tmp_path):
    with pytest.raises(ValueError, match="head_path '/nope' is not a saved folder \\(no such folder\\)"):
        load_plugin("lantern", head_path="/nope")
    with pytest.raises(ValueError, match="heads_path .* is not a saved folder \\(no config.json there\\)"):
        load_plugin("ssd", heads_path=str(tmp_path))


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("mmspec ")


@pytest.mark.parametrize("args", [["list"], ["list", "--modality", "vision"], ["--help"], ["--version"],
                                  ["bench", "--help"], ["generate", "--help"], ["batch", "--help"],
                                  ["bench", "lanter"], ["generate", "nope"], ["generate", "ar", "--num", "0"],
                                  ["batch", "ar", "--inputs", "m.jsonl", "--out", "o", "--batch-size", "0"]])
def test_light_commands_and_early_mistakes_do_not_import_torch(args):
    """In a fresh interpreter: listing, help, the version and argument mistakes answer without loading torch
    (which takes seconds), so a typo is reported at once."""
    import subprocess
    import sys

    code = ("import sys\nfrom mmspec.common.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if args[:1] == ["list"]:
        assert "lantern" in done.stdout and ("ctc_draft" in done.stdout) == (len(args) == 1)
    if "lanter" in args or "nope" in args:
        assert "error: unknown plugin" in done.stderr and "available: ar," in done.stderr


def test_train_head_never_writes_over_shipped_weights_unless_asked(no_model, capsys):
    from mmspec.plugins.lantern import BUNDLED_EAGLE_HEAD

    assert cli.main(["train-head", "lantern", "--out", str(BUNDLED_EAGLE_HEAD)]) == 2
    assert "is inside the weights mmspec ships" in capsys.readouterr().err
    assert cli.main(["train-head", "lantern", "--out", str(BUNDLED_EAGLE_HEAD), "--overwrite"]) == 2
    assert "--overwrite-shipped" in capsys.readouterr().err
