"""Errors of weight staging, translated from botocore, aiohttp and the OS where they enter.

    StagingError                  temporary?
    ├── InvalidWeightURI          no        not an s3://bucket/prefix/ URI
    ├── InvalidWeightLayout       no        an object name that cannot be a local file
    ├── SourceError               no        the object store refused, for a reason that stays
    │   ├── SourceUnavailable     yes       5xx, throttling, timeouts, refused or cut connections
    │   ├── SourceNotFound        no        no such bucket, prefix or object
    │   ├── SourceAccessDenied    no        credentials missing or rejected
    │   └── SourceChanged         no        an object changed while it was being staged
    ├── IntegrityError            no        size or checksum mismatch, even after a re-download
    ├── DiskBudgetExceeded        maybe     does not fit, even after evicting unpinned models
    ├── LocalStorageError         no        the cache folder could not be written or read
    └── ModelNotStaged            no        warm() of a model that has no published copy

`temporary` says whether trying again later can help (the gateway answers 503 with
Retry-After for those). Messages name buckets, keys and sizes, never a credential: botocore's
own message text is left out on purpose, because some S3-compatible servers echo request
details into it.
"""

from __future__ import annotations


class StagingError(Exception):
    temporary = False


class InvalidWeightURI(StagingError):
    pass


class InvalidWeightLayout(StagingError):
    pass


class SourceError(StagingError):
    pass


class SourceUnavailable(SourceError):
    temporary = True


class SourceNotFound(SourceError):
    pass


class SourceAccessDenied(SourceError):
    pass


class SourceChanged(SourceError):
    pass


class IntegrityError(StagingError):
    pass


class DiskBudgetExceeded(StagingError):
    def __init__(self, model: str, needed: int, budget: int, unevictable: int) -> None:
        super().__init__(
            f"{model} needs {needed} bytes but the disk budget is {budget} bytes, "
            f"{unevictable} of which are pinned or being staged"
        )
        self.model = model
        self.needed = needed
        self.budget = budget
        self.unevictable = unevictable
        # Unpinning, or a staging in progress ending, can make room; a bigger budget cannot.
        self.temporary = needed <= budget


class LocalStorageError(StagingError):
    pass


class ModelNotStaged(StagingError):
    pass
