"""``moeless deploy``/``destroy``: drive the CDK app in ``cdk/`` and put the package where it reads it.

The order of a deploy: (1) the Artifacts stack (bucket, ECR), (2) the package and plan uploaded
to it (unchanged files skipped, so a re-run after an interruption resumes), (3) every stack,
(4) the endpoint and the API key's value read back. The CDK CLI runs as a subprocess (the
pinned one in ``cdk/node_modules``); ``runner`` lets tests stand in for it. ``synthesize`` needs
neither the CLI nor credentials nor Docker: it runs the app the way the CLI does, with
``CDK_OUTDIR`` and ``CDK_CONTEXT_JSON``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moeless.checkout import CDK_APP_DIR
from moeless.deployment.stage import StageNames
from moeless.errors import MoelessError

NODE_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "CDK_DISABLE_VERSION_CHECK": "1"}

Runner = Callable[..., subprocess.CompletedProcess]


class DeployError(MoelessError):
    """A deploy step failed; the message names the step and what to do."""


@dataclass
class DeployRequest:
    """One deployment of a package with a plan. ``context`` adds ``moeless:*`` CDK context keys;
    ``assembly``, a cloud assembly :func:`synthesize` wrote, is deployed as it is instead of
    running the app again for each CDK command (its context is then the one it was made with)."""

    artifacts: Path
    plan: Path | None = None
    stage: str = "dev"
    profile: str | None = None
    cdk_dir: Path = CDK_APP_DIR
    context: dict[str, Any] = field(default_factory=dict)
    assembly: Path | None = None

    @property
    def names(self) -> StageNames:
        return StageNames(self.stage)

    def app_context(self) -> dict[str, Any]:
        """The ``moeless:*`` context of this deployment (cdk.json supplies the rest)."""
        context = {"moeless:artifacts": str(Path(self.artifacts).resolve()), "moeless:stage": self.stage}
        if self.plan:
            context["moeless:plan"] = str(Path(self.plan).resolve())
        return context | self.context


@dataclass
class DeployResult:
    endpoint: str
    api_key: str
    outputs: dict[str, dict[str, str]]


def _cdk_json(cdk_dir: Path) -> dict[str, Any]:
    path = cdk_dir / "cdk.json"
    if not path.is_file():
        raise DeployError(f"no CDK app at {cdk_dir} (cdk.json missing): pass --cdk-dir")
    return json.loads(path.read_text())


def synthesize(request: DeployRequest, outdir: Path, runner: Runner = subprocess.run) -> Path:
    """Synthesise the cloud assembly into ``outdir`` offline (no credentials, no Docker, no CDK CLI).

    A relative ``outdir`` is the caller's (the app runs in ``cdk_dir``): it is resolved here, and
    the absolute folder is returned.
    """
    outdir = Path(outdir).resolve()
    context = _cdk_json(request.cdk_dir).get("context", {}) | request.app_context()
    env = os.environ | NODE_ENV | {"CDK_OUTDIR": str(outdir), "CDK_CONTEXT_JSON": json.dumps(context)}
    outdir.mkdir(parents=True, exist_ok=True)
    result = runner(
        [sys.executable, "app.py"], cwd=request.cdk_dir, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise DeployError(f"cdk synth failed:\n{_tail(result)}")
    return outdir


def cdk_cli(cdk_dir: Path) -> Path:
    cli = cdk_dir / "node_modules" / ".bin" / "cdk"
    if not cli.is_file():
        raise DeployError(f"the pinned CDK CLI is missing: run `npm ci --prefix {cdk_dir}` (make setup does)")
    return cli


def cdk_command(request: DeployRequest, verb: str, stacks: list[str], *extra: str) -> list[str]:
    """The ``cdk`` command line for ``verb`` on ``stacks`` with this deployment's context."""
    app = str(Path(request.assembly).resolve()) if request.assembly else f"{sys.executable} app.py"
    command = [str(cdk_cli(request.cdk_dir)), verb, *stacks, "--app", app, "--no-notices"]
    if not request.assembly:
        for key, value in request.app_context().items():
            command += ["-c", f"{key}={value}"]
    if request.profile:
        command += ["--profile", request.profile]
    return command + list(extra)


def _run_cdk(request: DeployRequest, command: list[str], runner: Runner, step: str) -> None:
    result = runner(command, cwd=request.cdk_dir, env=os.environ | NODE_ENV, check=False)
    if result.returncode != 0:
        raise DeployError(
            f"{step} failed (cdk exited {result.returncode}); re-run to resume: {' '.join(command[1:3])}"
        )


def deploy(
    request: DeployRequest,
    session: Any,
    runner: Runner = subprocess.run,
    say: Callable[[str], None] = print,
) -> DeployResult:
    """Deploy the stacks and the package; ``session`` is a boto3 Session for the same account."""
    from moeless.artifacts.store import upload_artifacts
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import plan_for

    plan = plan_for(load_manifest(request.artifacts), request.plan)  # refuse a bad plan before any cloud call
    outputs_file = request.cdk_dir / "cdk.out" / f"outputs-{request.stage}.json"
    artifacts_stack = f"{request.names.stack_prefix}-Artifacts"
    say(f"[1/4] deploying {artifacts_stack} (bucket, image repositories)...")
    _run_cdk(
        request,
        cdk_command(
            request,
            "deploy",
            [artifacts_stack],
            "--require-approval",
            "never",
            "--outputs-file",
            str(outputs_file),
        ),
        runner,
        "deploying the artifacts stack",
    )
    outputs = _outputs(outputs_file)
    bucket = outputs[artifacts_stack]["BucketName"]
    names = request.names
    say(f"[2/4] uploading the package to s3://{bucket}/{names.artifacts_prefix}/ ...")
    s3 = session.client("s3")
    report = upload_artifacts(s3, request.artifacts, f"s3://{bucket}/{names.artifacts_prefix}", progress=True)
    s3.put_object(Bucket=bucket, Key=names.plan_key, Body=json.dumps(plan.to_dict()).encode())
    say(f"      {report}, and the plan ({len(plan.functions)} functions)")
    say("[3/4] deploying the expert functions, the backbone and the API (images build here)...")
    _run_cdk(
        request,
        cdk_command(
            request, "deploy", ["--all"], "--require-approval", "never", "--outputs-file", str(outputs_file)
        ),
        runner,
        "deploying the stacks",
    )
    outputs = _outputs(outputs_file)
    api = outputs[f"{request.names.stack_prefix}-Api"]
    say("[4/4] reading the API key...")
    key = session.client("apigateway").get_api_key(apiKey=api["ApiKeyId"], includeValue=True)["value"]
    return DeployResult(api["Endpoint"], key, outputs)


def destroy(request: DeployRequest, runner: Runner = subprocess.run) -> None:
    """Delete every stack of the stage; the bucket and image repositories are kept (they hold data)."""
    _run_cdk(request, cdk_command(request, "destroy", ["--all"], "--force"), runner, "destroying the stacks")


def _outputs(path: Path) -> dict[str, dict[str, str]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"cdk wrote no readable outputs at {path}: {exc}") from None


def _tail(result: subprocess.CompletedProcess) -> str:
    text = (result.stderr or "") + (result.stdout or "")
    return (
        "\n".join(line for line in text.splitlines() if not line.startswith("b'!!"))[-4000:].strip()
        or "(no output)"
    )
