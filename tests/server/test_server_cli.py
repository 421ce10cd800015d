"""``specdec serve`` command line: every flag, its SPECDEC_* variable, precedence, validation."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from server.cli import parse_serve_args, settings_from_args
from tests.helpers.servers import REPO_ROOT

FLAGS = [
    "--model", "--draft-model", "--speculative-method", "--num-speculative-tokens", "--host", "--port",
    "--device", "--dtype", "--quantize", "--max-num-seqs", "--max-model-len", "--max-queue", "--api-key",
    "--served-model-name", "--seed", "--log-level", "--prefill-chunk-size", "--ngram-min", "--ngram-max",
    "--adaptive-speculation", "--no-adaptive-speculation", "--cache-dir",
    "--allowed-hosts", "--header-timeout", "--body-timeout", "--keep-alive-timeout", "--limit-concurrency",
]


def test_help_documents_every_flag_and_its_variable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    for flag in FLAGS:
        assert flag in out, flag
        assert "SPECDEC_" + flag[2:].upper().replace("-", "_").removeprefix("NO_") in out
    assert "num_speculative_tokens" in out and "'speculative': false" in out


def test_defaults_leave_engine_defaults_alone() -> None:
    s = settings_from_args(parse_serve_args(["serve"], env={}), env={})
    assert s.engine.model is None and s.engine.draft_model is None  # the embedded default pair
    assert s.engine.speculative_method is None  # the engine picks draft or ngram
    assert (s.host, s.port, s.api_key, s.max_queue, s.log_level) == ("127.0.0.1", 8000, None, 256, "info")
    assert s.shutdown_grace_s == 30.0


def test_flags_map_to_settings() -> None:
    args = parse_serve_args(
        [
            "serve", "--model", "m", "--draft-model", "d", "--speculative-method", "ngram",
            "--num-speculative-tokens", "3", "--device", "cpu", "--dtype", "bfloat16", "--quantize", "int8",
            "--max-num-seqs", "4", "--max-model-len", "1024", "--max-queue", "7", "--api-key", "k",
            "--served-model-name", "name", "--seed", "5", "--log-level", "DEBUG", "--port", "9000", "--host", "0.0.0.0",
        ],
        env={},
    )
    s = settings_from_args(args, env={})
    e = s.engine
    assert (e.model, e.draft_model, e.speculative_method, e.num_speculative_tokens) == ("m", "d", "ngram", 3)
    assert (e.device, e.dtype, e.quantize, e.max_num_seqs, e.max_model_len, e.seed) == ("cpu", "bfloat16", "int8", 4, 1024, 5)
    assert (s.max_queue, s.api_key, s.served_model_name, s.log_level, s.port, s.host) == (7, "k", "name", "debug", 9000, "0.0.0.0")


def test_environment_variables_and_precedence() -> None:
    env = {"SPECDEC_MAX_NUM_SEQS": "3", "SPECDEC_API_KEY": "secret", "SPECDEC_PORT": "9100", "SPECDEC_SPECULATIVE_METHOD": "none",
           "SPECDEC_SHUTDOWN_GRACE": "2.5"}
    s = settings_from_args(parse_serve_args(["serve"], env=env), env=env)
    assert (s.engine.max_num_seqs, s.api_key, s.port, s.engine.speculative_method) == (3, "secret", 9100, "none")
    assert s.shutdown_grace_s == 2.5
    # A flag on the command line wins over its variable.
    s = settings_from_args(parse_serve_args(["serve", "--max-num-seqs", "6"], env=env), env=env)
    assert s.engine.max_num_seqs == 6


@pytest.mark.parametrize(
    "argv,env",
    [
        (["serve", "--max-num-seqs", "0"], {}),
        (["serve", "--speculative-method", "eagle"], {}),
        (["serve", "--port", "70000"], {}),
        (["serve", "--log-level", "loud"], {}),
        (["serve"], {"SPECDEC_MAX_NUM_SEQS": "many"}),
        (["serve"], {"SPECDEC_DEVICE": "tpu"}),
        (["serve"], {"SPECDEC_NUM_SPECULATIVE_TOKENS": "-1"}),
        (["serve", "--bogus"], {}),
        ([], {}),
    ],
)
def test_invalid_values_exit_with_usage_error(argv: list[str], env: dict, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(argv, env=env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for name in env:
        assert name in err  # the message names the variable at fault


def test_bad_grace_period_is_refused() -> None:
    with pytest.raises(SystemExit, match="SPECDEC_SHUTDOWN_GRACE"):
        settings_from_args(parse_serve_args(["serve"], env={}), env={"SPECDEC_SHUTDOWN_GRACE": "soon"})


def test_api_key_is_not_in_settings_repr() -> None:
    s = settings_from_args(parse_serve_args(["serve", "--api-key", "sk-very-secret"], env={}), env={})
    assert "sk-very-secret" not in repr(s)


def test_every_engine_config_field_is_a_flag_with_a_variable() -> None:
    """The flags are generated from EngineConfig: a new field cannot be forgotten on the CLI."""
    from server.cli import _subparser, build_parser
    from specdec_core.engine.config import EngineConfig

    help_text = _subparser(build_parser(), "serve").format_help()
    for f in dataclasses.fields(EngineConfig):
        assert "help" in f.metadata, f"EngineConfig.{f.name} has no --help text"
        flag, env = "--" + f.name.replace("_", "-"), "SPECDEC_" + f.name.upper()
        assert flag in help_text and env in help_text, f.name


def test_new_engine_flags_reach_the_engine_config() -> None:
    argv = ["serve", "--prefill-chunk-size", "64", "--ngram-max", "3", "--no-adaptive-speculation",
            "--ngram-min", "2", "--cache-dir", "/tmp/specdec-cache"]
    e = settings_from_args(parse_serve_args(argv, env={}), env={}).engine
    assert (e.prefill_chunk_size, e.ngram_min, e.ngram_max, e.adaptive_speculation) == (64, 2, 3, False)
    assert str(e.cache_dir) == "/tmp/specdec-cache"
    # Not given: the dataclass default (on), not argparse's.
    assert settings_from_args(parse_serve_args(["serve"], env={}), env={}).engine.adaptive_speculation is True


@pytest.mark.parametrize("raw,expected", [("0", False), ("false", False), ("off", False), ("1", True), ("Yes", True)])
def test_boolean_flag_from_environment(raw: str, expected: bool) -> None:
    env = {"SPECDEC_ADAPTIVE_SPECULATION": raw}
    assert settings_from_args(parse_serve_args(["serve"], env=env), env=env).engine.adaptive_speculation is expected
    # The command line still wins.
    flag = "--adaptive-speculation" if not expected else "--no-adaptive-speculation"
    assert settings_from_args(parse_serve_args(["serve", flag], env=env), env=env).engine.adaptive_speculation is not expected


@pytest.mark.parametrize(
    "env", [{"SPECDEC_ADAPTIVE_SPECULATION": "maybe"}, {"SPECDEC_PREFILL_CHUNK_SIZE": "0"}, {"SPECDEC_NGRAM_MAX": "x"}]
)
def test_bad_new_variables_name_the_variable(env: dict, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["serve"], env=env)
    assert exc.value.code == 2
    assert next(iter(env)) in capsys.readouterr().err


def test_inconsistent_engine_values_are_refused_by_the_engine_config() -> None:
    with pytest.raises(SystemExit, match="ngram_min <= ngram_max"):
        settings_from_args(parse_serve_args(["serve", "--ngram-min", "5", "--ngram-max", "3"], env={}), env={})


def test_parsing_does_not_import_torch() -> None:
    """--help and argument parsing must stay instant: EngineConfig is read without the engine."""
    code = (
        "import sys; from server.cli import build_parser, parse_serve_args, settings_from_args; "
        "build_parser().format_help(); settings_from_args(parse_serve_args(['serve'], env={}), env={}); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_a_malformed_model_file_is_one_line_and_exit_2(tmp_path) -> None:
    """A GGUF header claiming a 2^40-byte string (the server allocated until killed at 6 GB) is
    refused before the port opens: one line naming the file and the field, exit 2, no traceback,
    and nothing loaded (the header is checked without torch)."""
    from tests.helpers.gguf_raw import STRING, gguf_bytes
    from tests.helpers.servers import free_port

    data, fields = gguf_bytes([("general.architecture", STRING, "llama")])
    length = [f for f in fields if f.role == "length"][1]  # the value's, after the key's
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:length.offset] + (1 << 40).to_bytes(8, "little") + data[length.offset + 8:])
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "server", "serve", "--model", str(bad),
                           "--port", str(free_port())], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    left = len(data) - length.offset - 8
    assert lines == [f"specdec serve: error: bad.gguf: general.architecture length: expected at most the {left} "
                     f"bytes left in the file (at byte {length.offset + 8}), found {1 << 40}"]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "specdec_core.loading.gguf_file" in imported and "torch" not in imported  # nothing heavy imported
