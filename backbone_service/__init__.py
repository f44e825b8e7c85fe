"""The backbone service: the REST endpoint over :mod:`moeless.serving.backbone`."""
