"""``moeless deploy``/``destroy``: drive the CDK app in ``cdk/`` and put the package where it reads it.

The order of a deploy: (1) the account's quotas checked against the plan
(:mod:`moeless.deployment.preflight`), (2) the Artifacts stack (bucket, ECR), (3) the package
uploaded under its digest and the plan under its own (unchanged files skipped, so a re-run after an
interruption resumes; a new package is a new folder, so functions still reading the old one never
see it half-replaced), (4) every stack, (5) provisioned concurrency allocated through the Lambda API
(a failed allocation is reported, not rolled back), (6) the API key's value read back.

The CDK CLI runs as a subprocess (the pinned one in ``cdk/node_modules``); ``runner`` lets tests
stand in for it. ``synthesize`` needs neither the CLI nor credentials nor Docker: it runs the app
the way the CLI does, with ``CDK_OUTDIR`` and ``CDK_CONTEXT_JSON``.
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

from moeless.aws_limits import MAX_FUNCTION_MEMORY_MB
from moeless.checkout import CDK_APP_DIR
from moeless.contracts.manifest import Manifest
from moeless.contracts.plan import Plan
from moeless.deployment.preflight import (
    AccountFit,
    check_account,
    require_fit,
    slow_functions,
)
from moeless.deployment.retained import remove_retained, retained_resources
from moeless.deployment.stage import StageNames
from moeless.errors import MoelessError
from moeless.planning.provisioning import Allocation

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
    allocations: list[Allocation] = field(default_factory=list)

    @property
    def unallocated(self) -> list[Allocation]:
        """Functions whose provisioned concurrency is not ready (they serve on demand meanwhile)."""
        return [a for a in self.allocations if a.status != "READY"]


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


def check(
    request: DeployRequest,
    session: Any,
    manifest: Manifest,
    plan: Plan,
    max_function_memory_mb: int = MAX_FUNCTION_MEMORY_MB,
) -> AccountFit:
    """The account's fit for ``plan`` of ``request``'s package (``deploy --check``); also refuses a
    plan with functions too slow to cold-start, and a stage whose retained bucket or repositories a
    ``cdk destroy`` left (CloudFormation cannot create them again)."""
    if request.context.get("moeless:expertCode", "s3") == "s3" and (slow := slow_functions(plan, manifest)):
        raise DeployError(
            f"{len(slow)} function(s) cannot cold-start in time, e.g. {slow[0]}; re-plan with more "
            "functions (more --workers), or bake the experts into the images (--expert-code image)"
        )
    if leftovers := retained_resources(session, request.names):
        raise DeployError(
            f"stage {request.stage} has no stacks but its {', '.join(leftovers)} remain (a `cdk destroy` "
            f"keeps them): run `moeless destroy {request.artifacts} --stage {request.stage}` to remove "
            "them, or deploy under another --stage"
        )
    return check_account(
        session.client("lambda"), plan, request.names.function_prefix, max_function_memory_mb
    )


def deploy(
    request: DeployRequest,
    session: Any,
    runner: Runner = subprocess.run,
    say: Callable[[str], None] = print,
    max_function_memory_mb: int = MAX_FUNCTION_MEMORY_MB,
) -> DeployResult:
    """Deploy the stacks and the package; ``session`` is a boto3 Session for the same account."""
    from moeless.artifacts.store import upload_artifacts
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import plan_for
    from moeless.planning.provisioning import allocate_provisioned

    manifest = load_manifest(request.artifacts)
    plan = plan_for(manifest, request.plan)  # refuse a bad plan before any cloud call
    names = request.names
    say("[1/6] checking the account's Lambda quotas...")
    fit = check(request, session, manifest, plan, max_function_memory_mb)
    say(f"      {fit.summary()}")
    require_fit(fit)
    outputs_file = request.cdk_dir / "cdk.out" / f"outputs-{request.stage}.json"
    artifacts_stack = f"{names.stack_prefix}-Artifacts"
    say(f"[2/6] deploying {artifacts_stack} (bucket, image repositories)...")
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
    package = names.package_prefix(manifest.digest())
    say(f"[3/6] uploading the package to s3://{bucket}/{package}/ ...")
    s3 = session.client("s3")
    report = upload_artifacts(s3, request.artifacts, f"s3://{bucket}/{package}", progress=True)
    s3.put_object(Bucket=bucket, Key=names.plan_key(plan.digest()), Body=json.dumps(plan.to_dict()).encode())
    say(f"      {report}, and the plan ({len(plan.functions)} functions)")
    say("[4/6] deploying the expert functions, the backbone and the API (images build here)...")
    _run_cdk(
        request,
        cdk_command(
            request, "deploy", ["--all"], "--require-approval", "never", "--outputs-file", str(outputs_file)
        ),
        runner,
        "deploying the stacks",
    )
    outputs = _outputs(outputs_file)
    wanted = sum(spec.provisioned_concurrency for spec in plan.functions)
    allocations = []
    if request.context.get("moeless:target") == "localstack":
        say("[5/6] provisioned concurrency: none (the LocalStack profile deploys no functions)")
    else:
        say(f"[5/6] allocating provisioned concurrency ({wanted} environments)...")
        allocations = allocate_provisioned(session.client("lambda"), plan.prefixed(names.function_prefix))
    for allocation in allocations:
        if allocation.status != "READY":
            say(f"      not ready: {allocation}")
    api = outputs[f"{names.stack_prefix}-Api"]
    say("[6/6] reading the API key...")
    key = session.client("apigateway").get_api_key(apiKey=api["ApiKeyId"], includeValue=True)["value"]
    return DeployResult(api["Endpoint"], key, outputs, allocations)


def destroy(
    request: DeployRequest,
    session: Any,
    runner: Runner = subprocess.run,
    keep_data: bool = False,
) -> list[str]:
    """Delete every stack of the stage, then (unless ``keep_data``) the bucket and image repositories
    the stacks retain, so that the stage can be deployed again; returns what was removed."""
    _run_cdk(request, cdk_command(request, "destroy", ["--all"], "--force"), runner, "destroying the stacks")
    if keep_data:
        return []
    return remove_retained(session, request.names)


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
