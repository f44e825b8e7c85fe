"""A local Lambda host: runs functions under the real ``awslambdaric`` runtime client, locally.

Each function instance is an ``awslambdaric`` process polling its own Lambda Runtime API endpoint;
callers use Lambda's API (boto3 or the AWS CLI with ``endpoint_url``). The host keeps the Lambda
semantics the planner relies on (one request per instance, scale-out, cold starts and their init
limits, idle reaping, a published version and its alias, provisioned and reserved concurrency within
the account's limit) and meters what AWS would bill.
"""

from moeless.aws_limits import LambdaLimits
from moeless.lambda_host.host import LambdaHost
from moeless.lambda_host.instance import FunctionConfig

__all__ = ["FunctionConfig", "LambdaHost", "LambdaLimits"]
