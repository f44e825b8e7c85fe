#!/bin/sh
# Runs inside LocalStack when it is ready: the CDK bootstrap's bucket, so `cdklocal deploy` works.
awslocal s3 mb s3://cdk-hnb659fds-assets-000000000000-us-east-1 || true
