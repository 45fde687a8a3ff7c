# Model weights: one folder per model under var.weights_prefix, read by the stager (and the
# gateway) through IRSA. Private, encrypted with a KMS key of its own, versioned.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  weights_bucket = coalesce(var.weights_bucket_name, "${var.name}-weights-${data.aws_caller_identity.current.account_id}")
}

resource "aws_kms_key" "weights" {
  description             = "${var.name}: model weights bucket"
  enable_key_rotation     = true
  deletion_window_in_days = 30
}

resource "aws_kms_alias" "weights" {
  name          = "alias/${var.name}-weights"
  target_key_id = aws_kms_key.weights.key_id
}

resource "aws_s3_bucket" "weights" {
  bucket = local.weights_bucket
}

resource "aws_s3_bucket_public_access_block" "weights" {
  bucket                  = aws_s3_bucket.weights.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "weights" {
  bucket = aws_s3_bucket.weights.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "weights" {
  bucket = aws_s3_bucket.weights.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.weights.arn
    }
    # One KMS request per bucket key instead of per object: cheaper, and faster staging.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_versioning" "weights" {
  bucket = aws_s3_bucket.weights.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "weights" {
  bucket = aws_s3_bucket.weights.id

  rule {
    id     = "expire-old-versions"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_weights_retention_days
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  depends_on = [aws_s3_bucket_versioning.weights]
}

# TLS only.
data "aws_iam_policy_document" "weights_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.weights.arn,
      "${aws_s3_bucket.weights.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "weights" {
  bucket = aws_s3_bucket.weights.id
  policy = data.aws_iam_policy_document.weights_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.weights]
}
