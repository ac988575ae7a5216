"""The delay proxy in front of the real local S3 server, with boto3 as the client."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config

from pipeflow.testing import LocalS3
from pipeflow.testing.proxy import DelayProxy, Faults

pytestmark = pytest.mark.s3


def _client(url: str, s3: LocalS3, **config):
    return boto3.client("s3", endpoint_url=url, region_name=s3.region, aws_access_key_id=s3.access_key,
                        aws_secret_access_key=s3.secret_key,
                        config=Config(s3={"addressing_style": "path"}, **config))


def test_boto3_through_the_proxy_counts_gets_puts_and_lists(s3, s3_bucket):
    with DelayProxy(s3.endpoint, delay_ms=5) as proxy:
        client = _client(proxy.url, s3)
        data = bytes(range(256)) * 4000  # ~1 MB: boto3 sends "Expect: 100-continue"
        client.put_object(Bucket=s3_bucket, Key="a/x.bin", Body=data)
        assert client.get_object(Bucket=s3_bucket, Key="a/x.bin")["Body"].read() == data
        assert client.head_object(Bucket=s3_bucket, Key="a/x.bin")["ContentLength"] == len(data)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="a/")["Contents"]]
        assert keys == ["a/x.bin"]
        stats = proxy.stats()
    assert stats["requests"] == {"PUT": 1, "GET": 2, "HEAD": 1}
    assert stats["lists"] == 1


def test_boto3_retries_an_injected_slowdown(s3, s3_bucket):
    s3.put(s3_bucket, "k", b"payload")
    with DelayProxy(s3.endpoint, delay_ms=0, hook=lambda r: "error503" if r.index == 0 else None) as proxy:
        client = _client(proxy.url, s3, retries={"mode": "standard", "max_attempts": 3})
        assert client.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"payload"
        assert proxy.counts() == {"GET": 2}
        assert proxy.stats()["faults"] == {"error": 1}


def test_boto3_sees_the_slowdown_error_code(s3, s3_bucket):
    s3.put(s3_bucket, "k", b"payload")
    with DelayProxy(s3.endpoint, delay_ms=0, faults=Faults(error_rate=1.0)) as proxy:
        client = _client(proxy.url, s3, retries={"mode": "standard", "max_attempts": 1})
        with pytest.raises(client.exceptions.ClientError) as info:
            client.get_object(Bucket=s3_bucket, Key="k")
    assert info.value.response["Error"]["Code"] == "SlowDown"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
