"""A local Lambda host: runs functions under the real ``awslambdaric`` runtime client, locally.

Each function instance is an ``awslambdaric`` process polling its own Lambda Runtime API endpoint;
callers use Lambda's Invoke and concurrency APIs (boto3 with ``endpoint_url``). The host keeps the
Lambda semantics the planner relies on (one request per instance, scale-out, cold starts, idle
reaping, provisioned and reserved concurrency) and meters what AWS would bill.
"""

from moeless.lambda_host.host import LambdaHost
from moeless.lambda_host.instance import FunctionConfig

__all__ = ["FunctionConfig", "LambdaHost"]
