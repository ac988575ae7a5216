"""The peers pipeflow is measured against, written as the articles wrote them.

Each module follows one article's code (000: boto3 map-style dataset and the s5cmd sampler;
001: WebDataset with an overridden ``url_opener`` and ``pipe:``, torchdata DataPipes; 002: the
S3 Connector for PyTorch and fsspec random access), changed only where the article's snippet
does not run as printed (noted in place) and to read the endpoint of the local server from the
environment. Every ``make_*`` function returns what :mod:`benchmarks.harness` iterates.
"""
