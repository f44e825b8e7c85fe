"""``moeless deploy`` and ``moeless destroy``: the CDK app in cdk/, driven for one stage."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.options import echo_step, max_function_memory_option, plan_option

if TYPE_CHECKING:
    from moeless.contracts.plan import Plan
    from moeless.deployment.deploy import DeployRequest


def _stage(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from moeless.deployment.stage import StageNameError, check_stage

    try:
        return check_stage(value)
    except StageNameError as exc:
        raise click.BadParameter(str(exc)) from None


stage_option = click.option(
    "--stage",
    default="dev",
    show_default=True,
    callback=_stage,
    help="Deployment name (lower-case letters and digits, no '-'): prefixes stacks, functions and S3 keys.",
)
profile_option = click.option("--profile", help="AWS profile for boto3 and the CDK CLI.")
cdk_dir_option = click.option(
    "--cdk-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The CDK app [default: cdk/ of this checkout].",
)


def aws_session(profile: str | None) -> Any:
    """The boto3 Session of the account deployed to (``profile``: a named AWS profile)."""
    import boto3

    return boto3.Session(profile_name=profile)


def deployment_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """ARTIFACTS, --plan, --stage, --profile and --cdk-dir, handed to ``command`` as one
    :class:`moeless.deployment.deploy.DeployRequest` (its first argument); a bad plan is refused here,
    before anything starts."""

    @functools.wraps(command)
    def with_request(
        artifacts: Path,
        plan_path: Path | None,
        stage: str,
        profile: str | None,
        cdk_dir: Path | None,
        **kwargs,
    ) -> Any:
        from moeless.checkout import CDK_APP_DIR
        from moeless.contracts.manifest import load_manifest
        from moeless.contracts.plan import plan_for
        from moeless.deployment.deploy import DeployRequest

        plan = plan_for(load_manifest(artifacts), plan_path)
        request = DeployRequest(artifacts, plan_path, stage, profile, cdk_dir or CDK_APP_DIR)
        return command(request, plan, **kwargs)

    options = [
        click.argument("artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path)),
        plan_option,
        stage_option,
        profile_option,
        cdk_dir_option,
    ]
    for option in reversed(options):
        with_request = option(with_request)
    return with_request


@click.command()
@deployment_options
@click.option(
    "--expert-code",
    type=click.Choice(["s3", "image"]),
    default="s3",
    show_default=True,
    help="s3: one image, experts fetched from S3 at init; image: each function's experts baked in.",
)
@click.option("--synth-only", is_flag=True, help="Synthesise the cloud assembly (no credentials, no Docker).")
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("cdk.out"),
    show_default=True,
    help="Where --synth-only writes the cloud assembly.",
)
@click.option("--local", is_flag=True, help="Bring the same topology up on this machine instead of AWS.")
@click.option(
    "--aws-endpoint",
    metavar="URL",
    help="With --local: also create the S3/ECR/Lambda/API resources on this AWS API emulator "
    "(moto, LocalStack).",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="REST port with --local."
)
@click.option(
    "--check",
    is_flag=True,
    help="Only check that the account's Lambda quotas hold the plan (every deploy checks first).",
)
@max_function_memory_option
def deploy(
    request: DeployRequest,
    plan: Plan,
    expert_code: str,
    synth_only: bool,
    output: Path,
    local: bool,
    aws_endpoint: str | None,
    port: int,
    check: bool,
    max_function_memory_mb: int,
) -> None:
    """Deploy ARTIFACTS with a plan: S3 + ECR, one Lambda per plan function with its provisioned
    concurrency, the GPU backbone on ECS, and API Gateway. Prints the endpoint and API key.

    Needs AWS credentials, Docker (the images build during `cdk deploy`) and a bootstrapped
    account (`npx cdk bootstrap`); see docs/deploy.md. --synth-only needs none of them.
    """
    request.context["moeless:expertCode"] = expert_code
    if aws_endpoint and not local:
        raise click.UsageError(
            "--aws-endpoint is for --local (an emulator); a real deploy uses your AWS profile"
        )
    if local:
        _deploy_locally(request, plan, aws_endpoint, port)
        return
    if synth_only:
        from moeless.deployment.deploy import synthesize

        echo_step(f"synthesising stage {request.stage} into {output}...")
        output = synthesize(request, output)
        templates = sorted(p.name for p in output.glob("*.template.json"))
        click.echo(f"cloud assembly: {output} ({len(templates)} templates: {', '.join(templates)})")
        return
    from moeless.contracts.manifest import load_manifest
    from moeless.deployment.deploy import check as check_account
    from moeless.deployment.deploy import deploy as run_deploy
    from moeless.deployment.preflight import require_fit

    session = aws_session(request.profile)
    if check:
        fit = check_account(request, session, load_manifest(request.artifacts), plan, max_function_memory_mb)
        click.echo(fit.summary())
        require_fit(fit)
        click.echo(f"the account holds stage {request.stage}'s plan")
        return
    result = run_deploy(request, session, say=click.echo, max_function_memory_mb=max_function_memory_mb)
    click.echo(f"endpoint: {result.endpoint}")
    click.echo(f"api key:  {result.api_key}   (send it as the x-api-key header)")
    if result.unallocated:
        click.echo(
            f"{len(result.unallocated)} function(s) lack their provisioned concurrency (they serve on "
            "demand meanwhile): see above; running `moeless deploy` again retries them"
        )


def _deploy_locally(request: DeployRequest, plan: Plan, aws_endpoint: str | None, port: int) -> None:
    from cli.cmd_serve import LocalHost, serve_until_stopped
    from moeless.serving.backbone import BackboneConfig

    if aws_endpoint:
        import boto3

        from moeless.deployment.cloud_mirror import mirror_deployment

        session = boto3.Session(profile_name=request.profile)
        if session.region_name is None:  # emulators accept any region; boto3 needs one
            session = boto3.Session(profile_name=request.profile, region_name="us-east-1")
        report = mirror_deployment(
            session,
            request.artifacts,
            plan,
            request.stage,
            f"http://127.0.0.1:{port}",
            aws_endpoint,
            say=echo_step,
        )
        echo_step(
            f"emulator at {aws_endpoint}: bucket {report.bucket}, {len(report.functions)} functions, "
            f"REST API {report.api_id} (key {report.api_key})"
        )
        for note in report.notes:
            echo_step(f"note: {note}")
    serve_until_stopped(BackboneConfig(request.artifacts, request.plan), port, LocalHost())


@click.command()
@deployment_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--keep-data",
    is_flag=True,
    help="Keep the bucket and image repositories (the stage cannot be deployed again while they stay).",
)
def destroy(request: DeployRequest, plan: Plan, yes: bool, keep_data: bool) -> None:
    """Delete a stage's stacks, deployed from ARTIFACTS, then its bucket and image repositories
    (the stacks retain them; a stage is deployed again only once they are gone)."""
    from moeless.deployment.deploy import destroy as run_destroy

    what = "every stack" if keep_data else "every stack, the bucket and the image repositories"
    if not yes:
        click.confirm(f"Delete {what} of stage {request.stage!r}?", abort=True)
    removed = run_destroy(request, aws_session(request.profile), keep_data=keep_data)
    click.echo(f"stage {request.stage} destroyed" + (f"; removed {', '.join(removed)}" if removed else ""))
