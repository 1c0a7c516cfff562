"""The harness launcher and adapters, without a gateway: real processes, a real HTTP server, real namespaces.

Covers what every harness run relies on: stdin=/dev/null, a clean environment with a private HOME, the
process group killed on every exit path (normal exit, timeout, cancellation), the loopback-only network
namespace with its relay to the gateway port (and nothing else), and each adapter's config files and
switches from HARNESSES.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import tomllib
from pathlib import Path

import pytest
from aiohttp import web

from lodestar.kinds import PI_APIS
from lodestar_gateway.node.harnesses import (
    Aider,
    ClaudeCode,
    Cline,
    Codex,
    Command,
    ContinueCli,
    GatewayEndpoint,
    GeminiCli,
    Launcher,
    MiniSweAgent,
    OpenCode,
    OpenHands,
    OpenInterpreter,
    Pi,
    QwenCode,
    RunDirs,
    make_harness,
)
from tests.waiting import eventually

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


async def _wait_dead(pid: int, timeout_s: float = 5.0) -> None:
    await eventually(lambda: not _alive(pid), timeout_s, what=f"process {pid} to end")


@pytest.fixture
async def http_server():
    """A real aiohttp server on 127.0.0.1 that streams three chunks, 50 ms apart."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(3):
            await response.write(f"chunk{i};".encode())
            await asyncio.sleep(0.05)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/stream", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _endpoint(url: str) -> GatewayEndpoint:
    return GatewayEndpoint(base_url=url, session_key="sk-test-session", model="tiny")


FETCH = (
    "import os, urllib.request\n"
    "print(urllib.request.urlopen(os.environ['LODESTAR_GATEWAY_URL'] + '/stream', timeout=10).read().decode())\n"
)


@pytest.mark.slow
async def test_isolated_run_reaches_gateway_through_relay_and_nothing_else(tmp_path, http_server):
    launcher = Launcher(isolate_network=True)
    if not await launcher.isolation.available():
        pytest.skip("unshare --net is not permitted on this machine (no network namespaces)")
    dirs = RunDirs.under(tmp_path)
    # A second server in the host namespace only: reachable from here, not from the harness.
    other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    other_port = other.sockets[0].getsockname()[1]
    probe = (
        FETCH + "import socket\n"
        "for addr in [('127.0.0.1', int(os.environ['OTHER_PORT'])), ('1.1.1.1', 80)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=2).close(); print('REACHED', addr)\n"
        "    except OSError as e:\n"
        "        print('BLOCKED', addr[0], type(e).__name__)\n"
    )
    harness = Command([PY, "-c", probe], env={"OTHER_PORT": str(other_port)})
    result = await launcher.run(harness.prepare(dirs, _endpoint(http_server), "hi"), http_server, timeout_s=30)
    other.close()
    assert result.isolated
    assert result.returncode == 0, result.stderr
    assert "chunk0;chunk1;chunk2;" in result.stdout
    assert "REACHED" not in result.stdout
    assert "BLOCKED 127.0.0.1" in result.stdout
    assert "BLOCKED 1.1.1.1" in result.stdout


async def test_without_isolation_the_run_still_works(tmp_path, http_server):
    launcher = Launcher(isolate_network=False)
    harness = Command([PY, "-c", FETCH])
    result = await launcher.run(
        harness.prepare(RunDirs.under(tmp_path), _endpoint(http_server), "hi"), http_server, timeout_s=30
    )
    assert not result.isolated
    assert result.ok, result.stderr
    assert "chunk0;chunk1;chunk2;" in result.stdout


async def test_unusable_unshare_refuses_the_run_instead_of_running_it_bare(tmp_path, http_server, monkeypatch):
    """Never bare (docs/security.md): network isolation that cannot be set up refuses the run."""
    from lodestar.errors import FailedPreconditionError

    launcher = Launcher(isolate_network=True)
    monkeypatch.setattr(launcher.isolation, "unshare_argv", lambda: ["false", "--"])
    marker = tmp_path / "ran"
    harness = Command([PY, "-c", f"open({str(marker)!r}, 'w').close()"])
    with pytest.raises(FailedPreconditionError, match="network isolation"):
        await launcher.run(
            harness.prepare(RunDirs.under(tmp_path), _endpoint(http_server), "hi"), http_server, timeout_s=30
        )
    assert not marker.exists()


async def test_missing_program_is_a_failed_precondition(tmp_path, http_server):
    from lodestar.errors import FailedPreconditionError

    harness = Command([str(tmp_path / "no-such-harness")])
    with pytest.raises(FailedPreconditionError, match="cannot start"):
        await Launcher(isolate_network=False).run(
            harness.prepare(RunDirs.under(tmp_path), _endpoint(http_server), "hi"), http_server, timeout_s=30
        )


async def test_stdin_is_devnull_and_environment_is_clean(tmp_path, http_server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real-key-must-not-leak")
    monkeypatch.setenv("LODESTAR_TEST_PARENT_ONLY", "1")
    dirs = RunDirs.under(tmp_path)
    script = (
        "import os, sys, json\n"
        "print(json.dumps({'stdin': sys.stdin.read(), 'env': dict(os.environ), 'cwd': os.getcwd()}))\n"
    )
    harness = Command([PY, "-c", script])
    result = await Launcher(isolate_network=False).run(
        harness.prepare(dirs, _endpoint(http_server), "hi"), http_server, timeout_s=30
    )
    seen = json.loads(result.stdout)
    assert seen["stdin"] == ""
    assert seen["cwd"] == str(dirs.workdir)
    assert seen["env"]["HOME"] == str(dirs.home)
    assert seen["env"]["TMPDIR"] == str(dirs.tmpdir)
    assert seen["env"]["ANTHROPIC_API_KEY"] == "sk-test-session"
    assert "LODESTAR_TEST_PARENT_ONLY" not in seen["env"]


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.slow
async def test_timeout_kills_the_whole_process_group(tmp_path, http_server, isolate):
    launcher = Launcher(isolate_network=isolate)
    dirs = RunDirs.under(tmp_path)
    harness = Command(["bash", "-c", "sleep 300 & echo $! > bg.pid; sleep 300"])
    started = time.monotonic()
    result = await launcher.run(harness.prepare(dirs, _endpoint(http_server), "hi"), http_server, timeout_s=1.5)
    assert result.timed_out
    assert not result.ok
    assert result.returncode < 0
    assert time.monotonic() - started < 10
    await _wait_dead(int((dirs.workdir / "bg.pid").read_text()))


async def test_normal_exit_kills_leftover_background_processes(tmp_path, http_server):
    dirs = RunDirs.under(tmp_path)
    harness = Command(["bash", "-c", "sleep 300 & echo $! > bg.pid; echo done"])
    result = await Launcher(isolate_network=False).run(
        harness.prepare(dirs, _endpoint(http_server), "hi"), http_server, timeout_s=30
    )
    assert result.ok
    assert result.stdout.strip() == "done"
    await _wait_dead(int((dirs.workdir / "bg.pid").read_text()))


async def test_cancellation_kills_the_process_group(tmp_path, http_server):
    dirs = RunDirs.under(tmp_path)
    harness = Command(["bash", "-c", "echo $$ > main.pid; sleep 300"])
    task = asyncio.create_task(
        Launcher(isolate_network=False).run(
            harness.prepare(dirs, _endpoint(http_server), "hi"), http_server, timeout_s=300
        )
    )
    pid_file = dirs.workdir / "main.pid"
    pid = await eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), 10, what="the harness's pid")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_dead(int(pid))


def test_command_argv_template(tmp_path):
    dirs = RunDirs.under(tmp_path)
    inv = Command(["echo", "{model}", "at {base_url}: {prompt}"]).prepare(
        dirs, _endpoint("http://127.0.0.1:9/"), "do it"
    )
    assert inv.argv[1:] == ["tiny", "at http://127.0.0.1:9: do it"]
    assert Path(inv.argv[0]).name == "echo"


# --- adapters: config files, env and argv carry every switch of HARNESSES.md -----------------------------


def _prepare(harness, tmp_path, prompt="the prompt"):
    return harness.prepare(RunDirs.under(tmp_path), _endpoint("http://127.0.0.1:4567"), prompt)


def test_claude_code_switches(tmp_path):
    inv = _prepare(ClaudeCode(), tmp_path)
    env = inv.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4567"
    assert env["ANTHROPIC_API_KEY"] == "sk-test-session"
    assert env["ANTHROPIC_MODEL"] == "tiny"
    for switch in (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_AUTOUPDATER",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_UPDATES",
        "IS_SANDBOX",
    ):
        assert env[switch] == "1", switch
    assert inv.argv[1:3] == ["-p", "the prompt"]
    assert "--dangerously-skip-permissions" in inv.argv
    assert inv.argv[inv.argv.index("--allowedTools") + 1] == "Bash"


def test_codex_config(tmp_path):
    inv = _prepare(Codex(), tmp_path)
    config = tomllib.loads((Path(inv.env["CODEX_HOME"]) / "config.toml").read_text())
    provider = config["model_providers"][config["model_provider"]]
    assert config["model"] == "tiny"
    assert provider["base_url"] == "http://127.0.0.1:4567/v1"
    assert provider["wire_api"] == "responses"
    assert inv.env[provider["env_key"]] == "sk-test-session"
    assert config["analytics"]["enabled"] is False
    assert config["features"]["plugins"] is False
    assert config["check_for_update_on_startup"] is False
    assert config["otel"]["exporter"] == "none"
    assert inv.argv[1:3] == ["exec", "--skip-git-repo-check"]
    assert inv.argv[inv.argv.index("-s") + 1] == "workspace-write"
    assert inv.argv[-1] == "the prompt"


def test_qwen_code_settings(tmp_path):
    inv = _prepare(QwenCode(), tmp_path)
    settings = json.loads((Path(inv.env["HOME"]) / ".qwen" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["disableAutoUpdate"] is True
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert inv.env["OPENAI_BASE_URL"] == "http://127.0.0.1:4567/v1"
    assert inv.env["OPENAI_API_KEY"] == "sk-test-session"
    assert inv.env["OPENAI_MODEL"] == "tiny"
    assert "--yolo" in inv.argv
    assert inv.argv[-2:] == ["-p", "the prompt"]


def test_gemini_cli_settings(tmp_path):
    inv = _prepare(GeminiCli(), tmp_path)
    settings = json.loads((Path(inv.env["HOME"]) / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["disableAutoUpdate"] is True
    assert inv.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:4567"
    assert inv.env["GEMINI_API_KEY"] == "sk-test-session"
    assert inv.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    assert inv.argv[inv.argv.index("-m") + 1] == "tiny"
    assert "--yolo" in inv.argv


@pytest.mark.parametrize("api", PI_APIS)
def test_pi_models_json(tmp_path, api):
    inv = _prepare(Pi(api=api), tmp_path)
    agent_dir = Path(inv.env["PI_CODING_AGENT_DIR"])
    provider = json.loads((agent_dir / "models.json").read_text())["providers"]["lodestar"]
    expected_base = {
        "openai-completions": "http://127.0.0.1:4567/v1",
        "openai-responses": "http://127.0.0.1:4567/v1",
        "anthropic-messages": "http://127.0.0.1:4567",
        "google-generative-ai": "http://127.0.0.1:4567/v1beta",
    }[api]
    assert provider["api"] == api
    assert provider["baseUrl"] == expected_base
    assert inv.env[provider["apiKey"]] == "sk-test-session"
    assert provider["models"][0]["id"] == "tiny"
    assert json.loads((agent_dir / "settings.json").read_text())["enableInstallTelemetry"] is False
    assert {inv.env[k] for k in ("PI_OFFLINE", "PI_SKIP_VERSION_CHECK")} == {"1"}
    assert inv.env["PI_TELEMETRY"] == "0"
    assert inv.argv[inv.argv.index("--provider") + 1] == "lodestar"
    assert inv.argv[-2:] == ["-p", "the prompt"]
    assert make_harness(f"pi:{api}").api == api  # type: ignore[attr-defined]


def test_opencode_config_and_prompt_words(tmp_path: Path) -> None:
    prompt = '-f x  "q" 007 --help\nline two'
    inv = _prepare(OpenCode(), tmp_path, prompt)
    config = json.loads(Path(inv.env["OPENCODE_CONFIG"]).read_text())
    provider = config["provider"]["lodestar"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:4567/v1"
    assert provider["options"]["apiKey"] == "{env:LODESTAR_SESSION_KEY}"
    assert inv.env["LODESTAR_SESSION_KEY"] == "sk-test-session"
    assert list(provider["models"]) == ["tiny"]
    assert config["model"] == config["small_model"] == "lodestar/tiny"
    assert config["autoupdate"] is False
    assert config["share"] == "disabled"
    for switch in ("OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_CLAUDE_CODE"):
        assert inv.env[switch] == "1", switch
    assert inv.argv[1] == "run"
    assert inv.argv[inv.argv.index("--title") + 1] == "lodestar"  # a fixed title: no title-generation call
    words = inv.argv[inv.argv.index("--") + 1 :]
    # opencode quotes every message argument that holds a space, then joins them with spaces.
    assert not any(" " in word for word in words)
    assert " ".join(words) == prompt


def test_continue_cli_config(tmp_path: Path) -> None:
    inv = _prepare(ContinueCli(), tmp_path, "--help me")
    config_path = Path(inv.argv[inv.argv.index("--config") + 1])
    assert config_path.is_relative_to(tmp_path / "home")
    (model,) = json.loads(config_path.read_text())["models"]
    assert model["provider"] == "openai"
    assert model["apiBase"] == "http://127.0.0.1:4567/v1"
    assert model["apiKey"] == "sk-test-session"
    assert model["model"] == "tiny"
    assert "tool_use" in model["capabilities"]
    assert inv.env["CONTINUE_GLOBAL_DIR"] == str(tmp_path / "home" / ".continue")
    assert inv.env["CONTINUE_CLI_ENABLE_TELEMETRY"] == "0"
    assert {"--auto", "--print"} <= set(inv.argv)
    assert inv.argv[-2:] == ["--", "--help me"]  # a prompt that looks like an option stays the prompt


def test_cline_settings(tmp_path: Path) -> None:
    inv = _prepare(Cline(), tmp_path, "--help me")
    settings = tmp_path / "home" / ".cline" / "data" / "settings"
    providers = json.loads((settings / "providers.json").read_text())
    assert providers["lastUsedProvider"] == "openai-compatible"
    entry = providers["providers"]["openai-compatible"]
    assert entry["updatedAt"]  # without it Cline drops the entry and calls api.cline.bot
    assert entry["settings"] == {
        "provider": "openai-compatible",
        "apiKey": "sk-test-session",
        "model": "tiny",
        "baseUrl": "http://127.0.0.1:4567/v1",
    }
    assert json.loads((settings / "global-settings.json").read_text()) == {
        "telemetryOptOut": True,
        "autoUpdateEnabled": False,
    }
    assert inv.env["CLINE_SESSION_BACKEND_MODE"] == "local"  # no detached hub daemon
    assert "sk-test-session" not in inv.argv
    assert inv.argv[inv.argv.index("--provider") + 1] == "openai-compatible"
    assert inv.argv[-2:] == ["--", "--help me"]  # a prompt that looks like an option stays the prompt


def test_aider_invocation(tmp_path: Path) -> None:
    harness = Aider(bin_dir=tmp_path / "h" / "node_modules" / ".bin")
    assert harness.binary == tmp_path / "h" / "aider-venv" / "bin" / "aider"
    inv = _prepare(harness, tmp_path / "run", "-h")
    assert inv.env["OPENAI_API_BASE"] == "http://127.0.0.1:4567/v1"
    assert inv.env["OPENAI_API_KEY"] == "sk-test-session"
    assert "sk-test-session" not in inv.argv  # the key is not on the command line
    assert inv.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert inv.argv[inv.argv.index("--model") + 1] == "openai/tiny"
    assert {"--yes-always", "--no-git", "--no-check-update", "--no-analytics"} <= set(inv.argv)
    assert inv.argv[-1] == "--message=-h"
    for flag in ("--chat-history-file", "--input-history-file"):
        assert Path(inv.argv[inv.argv.index(flag) + 1]).is_relative_to(tmp_path / "run" / "home")
    assert "aider-venv" not in inv.env["PATH"]


def test_open_interpreter_profile(tmp_path: Path) -> None:
    harness = OpenInterpreter(bin_dir=tmp_path / "h" / "node_modules" / ".bin")
    assert harness.binary == tmp_path / "h" / "open-interpreter-venv" / "bin" / "interpreter"
    inv = _prepare(harness, tmp_path / "run", "-h")
    profile = Path(inv.argv[inv.argv.index("--profile") + 1])
    assert profile.is_relative_to(tmp_path / "run" / "home")
    assert profile.suffix == ".py"
    text = profile.read_text()
    assert "sk-test-session" not in text  # key and prompt come from the environment
    assert "-h" not in text
    assert "interpreter.auto_run = True" in text
    assert "interpreter.offline = True" in text
    assert inv.env["LODESTAR_SESSION_KEY"] == "sk-test-session"
    assert inv.env["LODESTAR_API_BASE"] == "http://127.0.0.1:4567/v1"
    assert inv.env["LODESTAR_MODEL"] == "tiny"
    assert inv.env["LODESTAR_PROMPT"] == "-h"
    assert "open-interpreter-venv" not in inv.env["PATH"]


def test_mini_swe_agent_config(tmp_path: Path) -> None:
    harness = MiniSweAgent(bin_dir=tmp_path / "h" / "node_modules" / ".bin")
    assert harness.binary == tmp_path / "h" / "mini-swe-agent-venv" / "bin" / "mini"
    inv = _prepare(harness, tmp_path / "run")
    config_path = Path(inv.argv[inv.argv.index("-c", inv.argv.index("-c") + 1) + 1])
    model = json.loads(config_path.read_text())["model"]
    assert model["model_name"] == "openai/tiny"
    assert model["model_kwargs"]["api_base"] == "http://127.0.0.1:4567/v1"
    assert model["cost_tracking"] == "ignore_errors"
    assert inv.env["OPENAI_API_KEY"] == "sk-test-session"
    assert inv.env["MSWEA_CONFIGURED"] == "true"  # else a first-run wizard prompts
    assert inv.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert {"--yolo", "--exit-immediately"} <= set(inv.argv)
    assert inv.argv[inv.argv.index("--task") + 1] == "the prompt"
    assert "mini-swe-agent-venv" not in inv.env["PATH"]  # the agent's commands must not see its python


def test_openhands_invocation(tmp_path: Path) -> None:
    harness = OpenHands(bin_dir=tmp_path / "h" / "node_modules" / ".bin")
    assert harness.binary == tmp_path / "h" / "openhands-venv" / "bin" / "python"
    inv = _prepare(harness, tmp_path / "run")
    assert inv.argv[1] == "-P"  # else the driver's folder shadows the `openhands` package
    assert Path(inv.argv[2]).name == "openhands_driver.py"
    assert inv.argv[inv.argv.index("--prompt") + 1] == "the prompt"
    assert inv.argv[inv.argv.index("--workdir") + 1] == str(inv.cwd)
    assert inv.env["LODESTAR_BASE_URL"] == "http://127.0.0.1:4567/v1"
    assert inv.env["LODESTAR_SESSION_KEY"] == "sk-test-session"
    assert inv.env["LODESTAR_MODEL"] == "tiny"


def test_unknown_harness_name_is_refused():
    from lodestar.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="unknown harness"):
        make_harness("cursor")
    with pytest.raises(InvalidArgumentError, match="unknown Pi API"):
        make_harness("pi:bedrock")


def test_missing_binary_is_a_failed_precondition(tmp_path):
    from lodestar.errors import FailedPreconditionError

    harness = ClaudeCode(bin_dir=tmp_path)
    assert not harness.is_installed()
    with pytest.raises(FailedPreconditionError, match="make harnesses"):
        harness.require_installed()
