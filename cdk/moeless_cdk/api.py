"""The REST endpoint: API Gateway in front of the backbone's load balancer through a VPC link.

Every public route of the service (:data:`moeless.contracts.rest.PUBLIC_ROUTES`), the completion and
chat bodies checked against :data:`BODY_SCHEMAS` before they reach the service (which checks them in
full), the two that may stream with ``ResponseTransferMode: STREAM`` (records reach the client as
they are made, for up to 15 minutes); an API key with a usage plan (throttle and daily quota), JSON
access logs, and a WAF web ACL with AWS's common rules and a per-IP rate limit. On LocalStack
(``moeless:target=localstack``) the routes call ``moeless:backboneUrl`` directly, without the VPC
link and the WAF, which the emulator lacks.
"""

from __future__ import annotations

import re
from typing import Any

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from moeless.contracts.rest import PUBLIC_ROUTES
from moeless_cdk.backbone import BackboneStack
from moeless_cdk.config import DeployConfig
from moeless_cdk.nag import acknowledge
from moeless_cdk.profile import left_out


def _request_schema(title: str, required: str, fields: dict[str, apigw.JsonSchema]) -> apigw.JsonSchema:
    """A request body in JSON Schema draft 4 (API Gateway's dialect): ``model``, the ``required``
    field, ``stream``, and ``fields``, as the service accepts them (it checks the rest in full)."""
    shared = {
        "model": apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, min_length=1),
        "stream": apigw.JsonSchema(type=apigw.JsonSchemaType.BOOLEAN),
    }
    return apigw.JsonSchema(
        schema=apigw.JsonSchemaVersion.DRAFT4,
        title=title,
        type=apigw.JsonSchemaType.OBJECT,
        required=["model", required],
        properties=shared | fields,
    )


COMPLETION_SCHEMA = _request_schema(
    "CompletionRequest",
    "prompt",
    {
        "prompt": apigw.JsonSchema(
            one_of=[
                apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, min_length=1),
                apigw.JsonSchema(
                    type=apigw.JsonSchemaType.ARRAY,
                    min_items=1,
                    items=apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, min_length=1),
                ),
            ]
        ),
        "max_tokens": apigw.JsonSchema(type=apigw.JsonSchemaType.INTEGER, minimum=1),
        "temperature": apigw.JsonSchema(type=apigw.JsonSchemaType.NUMBER, minimum=0, maximum=2),
        "top_p": apigw.JsonSchema(type=apigw.JsonSchemaType.NUMBER, minimum=0, maximum=1),
        "seed": apigw.JsonSchema(type=apigw.JsonSchemaType.INTEGER),
    },
)
CHAT_SCHEMA = _request_schema(
    "ChatCompletionRequest",
    "messages",
    {
        "messages": apigw.JsonSchema(
            type=apigw.JsonSchemaType.ARRAY,
            min_items=1,
            items=apigw.JsonSchema(type=apigw.JsonSchemaType.OBJECT, required=["role"]),
        )
    },
)
BODY_SCHEMAS = {"completion": COMPLETION_SCHEMA, "chat": CHAT_SCHEMA}
# API Gateway's quotas: a buffered integration answers within 29 s; a streamed one may run for 15
# minutes (https://docs.aws.amazon.com/apigateway/latest/developerguide/response-transfer-mode.html)
BUFFERED_TIMEOUT = Duration.seconds(29)
STREAM_TIMEOUT = Duration.minutes(15)
WAF_RATE_LIMIT_PER_5_MIN = 2000


class ApiStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, config: DeployConfig, backbone: BackboneStack, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        access_logs = logs.LogGroup(self, "AccessLogs", retention=logs.RetentionDays.ONE_MONTH)
        self.api = apigw.RestApi(
            self,
            "Api",
            rest_api_name=config.names.api_name,
            description="moeless: OpenAI-style completions served by a GPU backbone and expert Lambdas",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            api_key_source_type=apigw.ApiKeySourceType.HEADER,
            cloud_watch_role=True,
            deploy_options=apigw.StageOptions(
                stage_name=config.stage,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=False,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                metrics_enabled=True,
                tracing_enabled=True,
                throttling_rate_limit=config.throttle_rate_limit,
                throttling_burst_limit=config.throttle_burst_limit,
            ),
        )
        acknowledge(
            self.api,
            "AwsSolutions-IAM4",
            "API Gateway's account-level CloudWatch role uses AWS's managed push-to-logs policy",
            findings=[
                "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs"
            ],
        )
        if config.backbone_url is not None:  # LocalStack: straight to a service on this machine
            left_out(self, "VPC link", "WAF web ACL and its association")
            acknowledge(
                self.api,
                "AwsSolutions-APIG3",
                "LocalStack has no WAFv2 API; moeless:target=aws associates the web ACL with this stage",
            )
            base = config.backbone_url.rstrip("/")
            connection: dict[str, Any] = {}
        else:
            link = apigw.VpcLink(self, "VpcLink", targets=[backbone.load_balancer])
            base = f"http://{backbone.load_balancer.load_balancer_dns_name}"
            connection = {"connection_type": apigw.ConnectionType.VPC_LINK, "vpc_link": link}

        validator = self.api.add_request_validator(
            "Body",
            request_validator_name="json-body",
            validate_request_body=True,
            validate_request_parameters=True,
        )
        models = {
            kind: self.api.add_model(kind.title(), content_type="application/json", schema=schema)
            for kind, schema in BODY_SCHEMAS.items()
        }
        for route in PUBLIC_ROUTES:
            resource = self.api.root.resource_for_path(route.path)
            parameters = re.findall(r"{(\w+)}", route.path)
            integration = apigw.Integration(
                type=apigw.IntegrationType.HTTP_PROXY,
                integration_http_method=route.method,
                uri=f"{base}{route.path}",
                options=apigw.IntegrationOptions(
                    **connection,
                    # a stream's records reach the client as they come, for up to 15 minutes; a
                    # buffered answer must come whole within 29 s (API Gateway's quotas)
                    response_transfer_mode=(
                        apigw.ResponseTransferMode.STREAM
                        if route.streams
                        else apigw.ResponseTransferMode.BUFFERED
                    ),
                    timeout=STREAM_TIMEOUT if route.streams else BUFFERED_TIMEOUT,
                    request_parameters={
                        f"integration.request.path.{name}": f"method.request.path.{name}"
                        for name in parameters
                    }
                    or None,
                ),
            )
            resource.add_method(
                route.method,
                integration,
                api_key_required=True,
                request_parameters={f"method.request.path.{name}": True for name in parameters} or None,
                request_validator=validator if route.body or parameters else None,
                request_models={"application/json": models[route.body]} if route.body else None,
            )
        acknowledge(
            self.api,
            "AwsSolutions-APIG4",
            "callers authenticate with an API key under a usage plan, as OpenAI clients do; "
            "put a Cognito or IAM authorizer in front for per-user identity",
        )
        acknowledge(
            self.api,
            "AwsSolutions-COG4",
            "API keys, not Cognito user pools, identify callers (see AwsSolutions-APIG4)",
        )
        self.api_key = self.api.add_api_key("Key", api_key_name=config.names.api_name)
        usage_plan = self.api.add_usage_plan(
            "UsagePlan",
            name=config.names.api_name,
            throttle=apigw.ThrottleSettings(
                rate_limit=config.throttle_rate_limit, burst_limit=config.throttle_burst_limit
            ),
            quota=apigw.QuotaSettings(limit=config.quota_per_day, period=apigw.Period.DAY),
        )
        usage_plan.add_api_key(self.api_key)
        usage_plan.add_api_stage(stage=self.api.deployment_stage)
        if not config.emulated:
            self._web_acl(config)
        CfnOutput(self, "Endpoint", value=self.api.url)
        CfnOutput(self, "ApiKeyId", value=self.api_key.key_id)

    def _web_acl(self, config: DeployConfig) -> None:
        def visibility(name: str) -> wafv2.CfnWebACL.VisibilityConfigProperty:
            return wafv2.CfnWebACL.VisibilityConfigProperty(
                cloud_watch_metrics_enabled=True, metric_name=name, sampled_requests_enabled=True
            )

        common = wafv2.CfnWebACL.RuleProperty(
            name="aws-common",
            priority=0,
            override_action=wafv2.CfnWebACL.OverrideActionProperty(none={}),
            statement=wafv2.CfnWebACL.StatementProperty(
                managed_rule_group_statement=wafv2.CfnWebACL.ManagedRuleGroupStatementProperty(
                    vendor_name="AWS",
                    name="AWSManagedRulesCommonRuleSet",
                    # Prompts are long bodies by nature: count, do not block, the 8 KB body rule.
                    rule_action_overrides=[
                        wafv2.CfnWebACL.RuleActionOverrideProperty(
                            name="SizeRestrictions_BODY",
                            action_to_use=wafv2.CfnWebACL.RuleActionProperty(count={}),
                        )
                    ],
                )
            ),
            visibility_config=visibility("aws-common"),
        )
        # request patterns known to be malicious (Log4Shell's ${jndi:...} lookups among them)
        known_bad = wafv2.CfnWebACL.RuleProperty(
            name="aws-known-bad-inputs",
            priority=1,
            override_action=wafv2.CfnWebACL.OverrideActionProperty(none={}),
            statement=wafv2.CfnWebACL.StatementProperty(
                managed_rule_group_statement=wafv2.CfnWebACL.ManagedRuleGroupStatementProperty(
                    vendor_name="AWS", name="AWSManagedRulesKnownBadInputsRuleSet"
                )
            ),
            visibility_config=visibility("aws-known-bad-inputs"),
        )
        rate = wafv2.CfnWebACL.RuleProperty(
            name="per-ip-rate",
            priority=2,
            action=wafv2.CfnWebACL.RuleActionProperty(block={}),
            statement=wafv2.CfnWebACL.StatementProperty(
                rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                    limit=WAF_RATE_LIMIT_PER_5_MIN, aggregate_key_type="IP"
                )
            ),
            visibility_config=visibility("per-ip-rate"),
        )
        acl = wafv2.CfnWebACL(
            self,
            "WebAcl",
            scope="REGIONAL",
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            rules=[common, known_bad, rate],
            visibility_config=visibility(config.names.api_name),
        )
        wafv2.CfnWebACLAssociation(
            self,
            "WebAclAssociation",
            resource_arn=self.api.deployment_stage.stage_arn,
            web_acl_arn=acl.attr_arn,
        )
