"""Where this source checkout keeps the deployables that commands run from it: the expert
handler (``functions/expert``), the CDK app (``cdk/``) and the repository's neighbour
``../shared`` (data that only a developer's checkout has)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPERT_TASK_ROOT = REPO_ROOT / "functions" / "expert"
CDK_APP_DIR = REPO_ROOT / "cdk"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
