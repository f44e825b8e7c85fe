#!/usr/bin/env python3
"""The CDK app's entry (``cdk synth``/``cdk deploy`` run it; ``moeless deploy`` drives those).

The deployment comes from the CDK context: see ``moeless_cdk/config.py`` for the keys.
"""

import os
import sys

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from moeless_cdk import build_app
from moeless_cdk.config import config_from_context

from moeless.errors import MoelessError

app = cdk.App()
try:
    config = config_from_context(app.node.try_get_context)
except MoelessError as exc:
    sys.exit(f"moeless CDK app: {exc}")
build_app(app, config)
app.synth()
