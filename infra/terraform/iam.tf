# IRSA: the weights-reader role, assumable only by the listed ServiceAccounts of the
# gateway's namespace through the cluster's OIDC provider. It may list and read objects under
# the weights prefix of the weights bucket, and decrypt them through S3; nothing else.

locals {
  oidc_issuer_host = replace(data.aws_eks_cluster.this.identity[0].oidc[0].issuer, "https://", "")
}

data "aws_iam_policy_document" "weights_reader_trust" {
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
      values   = [for sa in var.k8s_service_accounts : "system:serviceaccount:${var.k8s_namespace}:${sa}"]
    }
  }
}

resource "aws_iam_role" "weights_reader" {
  name               = "${var.name}-weights-reader"
  description        = "${var.name}: read model weights (IRSA)"
  assume_role_policy = data.aws_iam_policy_document.weights_reader_trust.json
}

data "aws_iam_policy_document" "weights_reader" {
  statement {
    sid       = "ListWeightsPrefix"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.weights.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.weights_prefix, "${var.weights_prefix}*"]
    }
  }

  statement {
    sid       = "ReadWeights"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.weights.arn}/${var.weights_prefix}*"]
  }

  statement {
    sid       = "DecryptWeightsThroughS3"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.weights.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "weights_reader" {
  name   = "read-weights"
  role   = aws_iam_role.weights_reader.id
  policy = data.aws_iam_policy_document.weights_reader.json
}
