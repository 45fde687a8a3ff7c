output "weights_bucket" {
  description = "S3 bucket of the model weights (upload to s3://BUCKET/PREFIX<model>/)."
  value       = aws_s3_bucket.weights.bucket
}

output "weights_prefix" {
  description = "Key prefix of the weights: the only part of the bucket the gateway may read."
  value       = var.weights_prefix
}

output "weights_bucket_arn" {
  description = "ARN of the weights bucket."
  value       = aws_s3_bucket.weights.arn
}

output "weights_kms_key_arn" {
  description = "KMS key encrypting the weights (uploaders need kms:GenerateDataKey on it)."
  value       = aws_kms_key.weights.arn
}

output "weights_reader_role_arn" {
  description = "IRSA role for the eks.amazonaws.com/role-arn annotation of the model-weights ServiceAccount."
  value       = aws_iam_role.weights_reader.arn
}

output "batch_files_bucket" {
  description = "S3 bucket of batch files: batches.files.bucket in the gateway's configuration."
  value       = aws_s3_bucket.batch_files.bucket
}

output "batch_files_prefix" {
  description = "Key prefix of batch files: batches.files.prefix in the gateway's configuration."
  value       = var.batch_files_prefix
}

output "gateway_role_arn" {
  description = "IRSA role for the eks.amazonaws.com/role-arn annotation of the gateway ServiceAccount (batch files)."
  value       = aws_iam_role.gateway.arn
}

output "redis_primary_endpoint" {
  description = "ElastiCache primary endpoint (TLS)."
  value       = aws_elasticache_replication_group.redis.primary_endpoint_address
}

output "redis_port" {
  description = "ElastiCache port."
  value       = local.redis_port
}

output "redis_url_secret_arn" {
  description = "Secrets Manager secret holding the rediss:// URL (with the auth token) for the gateway-secrets Secret's redis-url."
  value       = aws_secretsmanager_secret.redis_url.arn
}

output "redis_url" {
  description = "rediss:// URL with the auth token: `terraform output -raw redis_url`. Sensitive."
  value       = local.redis_url
  sensitive   = true
}

output "gpu_node_group" {
  description = "Name of the GPU node group."
  value       = aws_eks_node_group.gpu.node_group_name
}

output "gpu_node_label" {
  description = "Label on GPU nodes (the workers' nodeSelector)."
  value       = local.gpu_node_labels
}

output "gpu_node_taint" {
  description = "Taint on GPU nodes (the workers' toleration)."
  value       = local.gpu_node_taint
}
