"""Both sides of the REST contract (moeless/contracts/rest.py): the service answers every public
route, and every route it answers is either public (the CDK app and the emulator mirror route it)
or private on purpose; so API Gateway never answers 403 for a path the service serves."""

from __future__ import annotations

import pytest

from moeless.contracts.rest import PRIVATE_PATHS, PUBLIC_ROUTES


@pytest.fixture(scope="module")
def served(tiny) -> set[tuple[str, str]]:
    from fastapi.routing import APIRoute
    from starlette.routing import Route

    from backbone_service.app import create_app
    from moeless.serving.backbone import Backbone, BackboneConfig

    backbone = Backbone(BackboneConfig(tiny.package(), device="cpu", replan_interval_s=0))
    try:
        app = create_app(backbone)
        return {
            (method, route.path)
            for route in app.routes
            if isinstance(route, APIRoute | Route)
            for method in (route.methods or set()) - {"HEAD", "OPTIONS"}
        }
    finally:
        backbone.close()


def test_every_public_route_is_served(served):
    assert {(route.method, route.path) for route in PUBLIC_ROUTES} <= served


def test_every_served_route_is_public_or_private_on_purpose(served):
    public = {(route.method, route.path) for route in PUBLIC_ROUTES}
    assert sorted(pair for pair in served - public if pair[1] not in PRIVATE_PATHS) == []
