"""The release workflow (.gitea/workflows/release.yml).

Two kinds of checks:

* structure, read from the YAML: the image job needs the test job, the test job runs
  ``bash .ci/run``, the sha tag is pushed by a step without condition and ``latest`` only by
  steps guarded by a tag-ref condition, secrets reach scripts only through ``env``;
* behaviour: the image job's steps are run for real with bash, the way a runner does
  (``${{ }}`` expressions in ``env`` and ``if``, ``$GITHUB_ENV`` between steps, a failed step
  skips the rest except ``if: always()``), against a stand-in ``docker`` on ``PATH`` that
  keeps a registry in a directory and answers ``docker run IMAGE proxy-operator version`` with
  the real ``proxy-operator version`` command. Only the expressions this workflow uses are
  understood: anything else fails the test, so the workflow cannot drift out of what is
  checked here.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".gitea" / "workflows" / "release.yml"
MIRROR = ROOT / ".github" / "workflows" / "release.yml"
BIN = Path(sys.executable).parent
TAG_CONDITION = "startsWith(github.ref, 'refs/tags/v')"

SHA = "0123456789abcdef0123456789abcdef01234567"
SECRETS = {"REGISTRY": "registry.test.invalid/crawl", "REGISTRY_USER": "ci-bot",
           "REGISTRY_PASSWORD": "s3cret-registry-password-9f1c"}
IMAGE = "registry.test.invalid/crawl/proxy-operator"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _triggers(wf: dict) -> dict:
    # YAML 1.1 reads the bare key `on` as boolean true.
    return wf.get("on", wf.get(True))


def _steps(wf: dict, job: str) -> list[dict]:
    return wf["jobs"][job]["steps"]


# -- structure --------------------------------------------------------------------------------

def test_gitea_and_github_copies_are_identical():
    assert MIRROR.read_text() == WORKFLOW.read_text()


def test_triggers_are_main_release_tags_and_manual(workflow):
    on = _triggers(workflow)
    assert on["push"]["tags"] == ["v*"]
    assert "main" in on["push"]["branches"]
    assert "workflow_dispatch" in on


def test_tests_run_before_anything_is_pushed(workflow):
    jobs = workflow["jobs"]
    assert any(s.get("run", "").strip() == "bash .ci/run" for s in _steps(workflow, "test"))
    pushing = [name for name, job in jobs.items()
               if any("docker push" in s.get("run", "") for s in job["steps"])]
    assert pushing == ["image"]
    needs = jobs["image"]["needs"]
    assert "test" in ([needs] if isinstance(needs, str) else needs)
    assert "if" not in jobs["image"], "the image job must not be skippable on its own"


def test_sha_tag_always_pushed_latest_only_on_tags(workflow):
    steps = _steps(workflow, "image")
    sha_pushes = [s for s in steps if re.search(r'docker push "\$IMAGE:\$SHA_TAG"', s.get("run", ""))]
    assert len(sha_pushes) == 1 and "if" not in sha_pushes[0]
    latest = [s for s in steps if "latest" in s.get("run", "")]
    assert latest, "no step pushes latest"
    for step in latest:
        assert TAG_CONDITION in step.get("if", ""), f"step {step.get('name')!r} touches latest without a tag condition"
    computed = [s for s in steps if "SHA_TAG=" in s.get("run", "")]
    assert computed and 'SHA_TAG=sha-${GITHUB_SHA:0:12}' in computed[0]["run"]
    builds = [s for s in steps if "docker build" in s.get("run", "")]
    assert builds and '--build-arg GIT_COMMIT="$GITHUB_SHA"' in builds[0]["run"]


def test_secrets_reach_scripts_only_through_env(workflow):
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            run = step.get("run", "")
            where = f"{job_name}/{step.get('name')}"
            assert "secrets." not in run, f"{where}: a secret is interpolated into the script"
            assert not re.search(r"^\s*set -[a-z]*x", run, re.M), f"{where}: set -x echoes secrets"
            if "REGISTRY_PASSWORD" in run:
                [line] = [ln for ln in run.splitlines() if "$REGISTRY_PASSWORD" in ln]
                assert re.search(r"printf '%s' \"\$REGISTRY_PASSWORD\" \| docker login .* --password-stdin", line)


# -- behaviour: run the image job ---------------------------------------------------------------

FAKE_DOCKER = '''#!{python}
"""A stand-in for the docker CLI: a local image store and a registry in $FAKE_DOCKER_STATE."""
import json, os, subprocess, sys
from pathlib import Path

state = Path(os.environ["FAKE_DOCKER_STATE"])
args = sys.argv[1:]
call = {{"argv": args}}
if "--password-stdin" in args:
    call["stdin"] = sys.stdin.read()
with open(state / "calls.jsonl", "a") as f:
    f.write(json.dumps(call) + "\\n")

def load(name):
    p = state / name
    return json.loads(p.read_text()) if p.exists() else {{}}

def save(name, data):
    (state / name).write_text(json.dumps(data))

local, registry = load("local.json"), load("registry.json")
cmd = args[0]
if cmd in ("login", "logout"):
    sys.exit(0)
if cmd == "manifest" and args[1] == "inspect":
    sys.exit(0 if args[2] in registry else 1)
if cmd == "pull":
    if args[1] not in registry:
        sys.exit("manifest unknown")
    local[args[1]] = registry[args[1]]
elif cmd == "build":
    commit = [a.split("=", 1)[1] for a in args if a.startswith("GIT_COMMIT=")][0]
    ref = args[args.index("--tag") + 1]
    assert args[-1] == "." and Path("Dockerfile").exists(), "build context is not the checkout"
    local[ref] = {{"revision": commit, "id": "built-" + commit[:12]}}
elif cmd == "image" and args[1] == "inspect":
    fmt, ref = args[args.index("--format") + 1], args[-1]
    assert "org.opencontainers.image.revision" in fmt
    print(local[ref]["revision"])
elif cmd == "run":
    ref = args[2]
    assert args[1] == "--rm" and args[3:] == ["proxy-operator", "version"], args
    env = {{**os.environ, "GIT_COMMIT": local[ref]["revision"]}}
    sys.exit(subprocess.run([os.environ["REAL_PROXY_OPERATOR"], "version"], env=env).returncode)
elif cmd == "tag":
    local[args[2]] = local[args[1]]
elif cmd == "push":
    if args[1] not in local:
        sys.exit("An image does not exist locally with the tag: " + args[1])
    registry[args[1]] = local[args[1]]
else:
    sys.exit("fake docker: unsupported command " + " ".join(args))
save("local.json", local)
save("registry.json", registry)
'''


class Unsupported(Exception):
    """An expression the mini-runner does not understand."""


@dataclass
class Run:
    """Result of one job run."""

    ok: bool
    executed: list[str] = field(default_factory=list)
    log: str = ""
    calls: list[dict] = field(default_factory=list)
    registry: dict = field(default_factory=dict)

    @property
    def pushed(self) -> list[str]:
        return [c["argv"][1] for c in self.calls if c["argv"][0] == "push"]

    def called(self, verb: str) -> list[list[str]]:
        return [c["argv"] for c in self.calls if c["argv"][0] == verb]


def _value(expr: str, ctx: dict) -> str:
    if m := re.fullmatch(r"secrets\.([A-Za-z_][A-Za-z0-9_]*)", expr):
        return ctx["secrets"].get(m.group(1), "")
    if m := re.fullmatch(r"github\.(sha|ref|ref_name)", expr):
        return ctx[m.group(1)]
    raise Unsupported(expr)


def _interpolate(text: str, ctx: dict) -> str:
    return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", lambda m: _value(m.group(1), ctx), str(text))


def _condition(expr: str | None, ctx: dict, failed: bool) -> bool:
    if expr is None:
        return not failed
    expr = re.sub(r"^\$\{\{\s*(.*?)\s*\}\}$", r"\1", expr.strip())
    if expr == "always()":
        return True
    if m := re.fullmatch(r"startsWith\(github\.ref, '([^']*)'\)", expr):
        return not failed and ctx["ref"].startswith(m.group(1))
    raise Unsupported(expr)


def run_image_job(workflow: dict, tmp_path: Path, *, ref: str, secrets: dict | None = None,
                  registry: dict | None = None, release: str | None = None) -> Run:
    """Run the image job's steps like a runner would; return what happened."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "Dockerfile").write_text((ROOT / "Dockerfile").read_text())
    state = tmp_path / "docker-state"
    state.mkdir()
    if registry:
        (state / "registry.json").write_text(json.dumps(registry))
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    docker = fake_bin / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    github_env = tmp_path / "github_env"
    github_env.write_text("")
    ctx = {"secrets": SECRETS if secrets is None else secrets, "sha": SHA, "ref": ref,
           "ref_name": ref.rsplit("/", 1)[-1]}
    base = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "GITHUB_SHA": SHA, "GITHUB_REF": ref,
            "GITHUB_REF_NAME": ctx["ref_name"], "GITHUB_ENV": str(github_env), "FAKE_DOCKER_STATE": str(state),
            "REAL_PROXY_OPERATOR": str(BIN / "proxy-operator")}
    job = workflow["jobs"]["image"]
    job_env = {k: _interpolate(v, ctx) for k, v in (job.get("env") or {}).items()}
    result, failed, logs = Run(ok=True), False, []
    for i, step in enumerate(job["steps"]):
        if "uses" in step:
            continue  # actions/checkout: the checkout directory stands in for it
        if not _condition(step.get("if"), ctx, failed):
            continue
        exported = dict(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line)
        env = {**base, **job_env, **exported,
               **{k: _interpolate(v, ctx) for k, v in (step.get("env") or {}).items()}}
        script = tmp_path / f"step{i}.sh"
        script.write_text(_interpolate(step["run"], ctx))
        # GitHub's and act's default shell for `run`: bash --noprofile --norc -eo pipefail {0}
        out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=checkout,
                             env=env, capture_output=True, text=True, timeout=60)
        result.executed.append(step["name"])
        logs.append(out.stdout + out.stderr)
        if out.returncode != 0:
            failed = True
    result.ok = not failed
    result.log = "\n".join(logs)
    calls = state / "calls.jsonl"
    result.calls = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    reg = state / "registry.json"
    result.registry = json.loads(reg.read_text()) if reg.exists() else {}
    return result


def _assert_no_secret_leak(run: Run) -> None:
    password = SECRETS["REGISTRY_PASSWORD"]
    assert password not in run.log, "the registry password reached the job log"
    for call in run.calls:
        assert password not in " ".join(call["argv"]), f"the password is on docker's command line: {call['argv']}"
    logins = [c for c in run.calls if c["argv"][0] == "login"]
    assert logins and all(c.get("stdin") == password for c in logins)
    assert logins[0]["argv"][1:] == ["registry.test.invalid", "--username", "ci-bot", "--password-stdin"]


def _release() -> str:
    return metadata.version("proxy-operator")


def test_branch_push_pushes_only_the_sha_tag(workflow, tmp_path):
    run = run_image_job(workflow, tmp_path, ref="refs/heads/main")
    assert run.ok, run.log
    assert run.pushed == [f"{IMAGE}:sha-{SHA[:12]}"]
    [build] = run.called("build")
    assert f"GIT_COMMIT={SHA}" in build and build[-1] == "."
    assert f"(commit {SHA})" in run.log  # the real `proxy-operator version`, through the image
    assert "Push the version tag and latest (release tags only)" not in run.executed
    assert run.executed[-1] == "Log out of the registry"
    _assert_no_secret_leak(run)


def test_release_tag_pushes_sha_version_and_latest_of_one_build(workflow, tmp_path):
    tag = f"v{_release()}"
    run = run_image_job(workflow, tmp_path, ref=f"refs/tags/{tag}")
    assert run.ok, run.log
    assert run.pushed == [f"{IMAGE}:sha-{SHA[:12]}", f"{IMAGE}:{tag}", f"{IMAGE}:latest"]
    assert len(run.called("build")) == 1
    assert {json.dumps(v) for v in run.registry.values()} == {json.dumps({"revision": SHA, "id": f"built-{SHA[:12]}"})}
    _assert_no_secret_leak(run)


def test_existing_sha_tag_is_promoted_not_rebuilt(workflow, tmp_path):
    tag = f"v{_release()}"
    earlier = {"revision": SHA, "id": "built-by-the-main-push"}
    run = run_image_job(workflow, tmp_path, ref=f"refs/tags/{tag}", registry={f"{IMAGE}:sha-{SHA[:12]}": earlier})
    assert run.ok, run.log
    assert run.called("build") == [] and run.called("pull") == [["pull", f"{IMAGE}:sha-{SHA[:12]}"]]
    assert run.pushed == [f"{IMAGE}:{tag}", f"{IMAGE}:latest"]
    assert run.registry[f"{IMAGE}:latest"] == earlier and run.registry[f"{IMAGE}:{tag}"] == earlier


def test_tag_that_does_not_match_the_release_pushes_nothing(workflow, tmp_path):
    run = run_image_job(workflow, tmp_path, ref="refs/tags/v999.0.0")
    assert not run.ok
    assert run.pushed == []
    assert "does not match the release" in run.log
    assert run.executed[-1] == "Log out of the registry"


def test_missing_registry_secret_fails_with_its_name(workflow, tmp_path):
    run = run_image_job(workflow, tmp_path, ref="refs/heads/main",
                        secrets={k: v for k, v in SECRETS.items() if k != "REGISTRY"})
    assert not run.ok
    assert "secret REGISTRY is not set" in run.log
    assert run.pushed == [] and run.called("build") == []


def test_mini_runner_rejects_expressions_it_does_not_know(tmp_path):
    """The runner above must fail loudly on anything it cannot evaluate (else checks go blind)."""
    wf = {"jobs": {"image": {"steps": [{"name": "x", "if": "github.event_name == 'push'", "run": "true"}]}}}
    with pytest.raises(Unsupported):
        run_image_job(wf, tmp_path, ref="refs/heads/main")
    assert _interpolate("${{ github.sha }}", {"sha": SHA}) == SHA
    with pytest.raises(Unsupported):
        _interpolate("${{ vars.IMAGE }}", {})
