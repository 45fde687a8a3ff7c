# Batch files (the gateway's /v1/files: batch inputs, outputs, errors): one object per file
# under var.batch_files_prefix, shared by every gateway replica (their job records are in
# Redis: a job runs on whichever replica claims it). Private, encrypted with a KMS key of its
# own, TLS only. Not versioned: a file deleted (by its tenant, by expiry, or with its
# tenant) is gone. Written and read only by the gateway's ServiceAccount, through IRSA.

locals {
  batch_files_bucket = coalesce(var.batch_files_bucket_name, "${var.name}-batch-files-${data.aws_caller_identity.current.account_id}")
}

resource "aws_kms_key" "batch_files" {
  description             = "${var.name}: batch files bucket"
  enable_key_rotation     = true
  deletion_window_in_days = 30
}

resource "aws_kms_alias" "batch_files" {
  name          = "alias/${var.name}-batch-files"
  target_key_id = aws_kms_key.batch_files.key_id
}

resource "aws_s3_bucket" "batch_files" {
  bucket = local.batch_files_bucket
}

resource "aws_s3_bucket_public_access_block" "batch_files" {
  bucket                  = aws_s3_bucket.batch_files.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "batch_files" {
  bucket = aws_s3_bucket.batch_files.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "batch_files" {
  bucket = aws_s3_bucket.batch_files.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.batch_files.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "batch_files" {
  bucket = aws_s3_bucket.batch_files.id

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

# TLS only.
data "aws_iam_policy_document" "batch_files_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.batch_files.arn,
      "${aws_s3_bucket.batch_files.arn}/*",
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

resource "aws_s3_bucket_policy" "batch_files" {
  bucket = aws_s3_bucket.batch_files.id
  policy = data.aws_iam_policy_document.batch_files_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.batch_files]
}

# IRSA: the gateway role, assumable only by the gateway's ServiceAccount. It may read, write
# and delete objects under the batch files prefix, through S3's use of the bucket's key.
data "aws_iam_policy_document" "gateway_trust" {
  statement {
    effect  = "Allow"
    actions = ["sts:AssumeRoleWithWebIdentity"]

    principals {
      type        = "Federated"
      identifiers = [data.aws_iam_openid_connect_provider.cluster.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer_host}:aud"
      values   = ["sts.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer_host}:sub"
      values   = ["system:serviceaccount:${var.k8s_namespace}:${var.gateway_service_account}"]
    }
  }
}

resource "aws_iam_role" "gateway" {
  name               = "${var.name}-gateway"
  description        = "${var.name}: the gateway's batch files (IRSA)"
  assume_role_policy = data.aws_iam_policy_document.gateway_trust.json
}

data "aws_iam_policy_document" "gateway" {
  statement {
    sid       = "BatchFiles"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.batch_files.arn}/${var.batch_files_prefix}*"]
  }

  statement {
    sid       = "BatchFilesKeyThroughS3"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.batch_files.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "gateway" {
  name   = "batch-files"
  role   = aws_iam_role.gateway.id
  policy = data.aws_iam_policy_document.gateway.json
}
