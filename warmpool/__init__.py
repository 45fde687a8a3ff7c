"""Cold-start manager. So far: weight staging (S3 to local disk, verified, read ahead).

`staging.WeightStager` is the entry point; `s3.S3WeightSource` the S3 side of it;
`progress.stage_with_progress` the terminal view for `gateway stage MODEL`. Nothing is
imported here, so `import warmpool` does not pull in aiobotocore.
"""
