"""``moeless verify``: re-check every artifact against its manifest."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("artifacts", type=click.Path(path_type=Path))
def verify(artifacts: Path) -> None:
    """Check every file of ARTIFACTS against manifest.json (size and sha256).

    Exits 1 and names each missing or altered file.
    """
    from moeless.artifacts.verify import verify_artifacts
    from moeless.contracts.manifest import load_manifest

    problems = verify_artifacts(artifacts)
    if problems:
        for problem in problems:
            click.echo(f"FAIL {problem}", err=True)
        raise click.ClickException(f"{len(problems)} file(s) in {artifacts} do not match the manifest")
    count = len(load_manifest(artifacts).all_files())
    click.echo(f"ok: {count} files in {artifacts} match the manifest")
