# Shared state of the gateway replicas (keys, quota counters, cache entries, the cache
# insert stream): ElastiCache for Redis OSS, cluster mode disabled (the gateway uses
# multi-key scripts and streams on one keyspace), a primary and replicas across zones
# with automatic failover, TLS in transit, an auth token, encrypted at rest, private
# subnets only.

resource "random_password" "redis_auth_token" {
  length = 64
  # ElastiCache accepts only some punctuation, and the token goes into a URL: letters and
  # digits only (64 of them are plenty).
  special = false
}

resource "aws_elasticache_subnet_group" "redis" {
  name        = "${var.name}-redis"
  description = "${var.name}: private subnets for Redis"
  subnet_ids  = var.private_subnet_ids
}

resource "aws_security_group" "redis" {
  name        = "${var.name}-redis"
  description = "${var.name}: Redis, reachable from the EKS cluster only"
  vpc_id      = var.vpc_id
}

locals {
  redis_port = 6379
  redis_client_security_group_ids = length(var.redis_client_security_group_ids) > 0 ? var.redis_client_security_group_ids : [
    data.aws_eks_cluster.this.vpc_config[0].cluster_security_group_id,
  ]
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_clients" {
  for_each = toset(local.redis_client_security_group_ids)

  security_group_id            = aws_security_group.redis.id
  description                  = "Redis (TLS) from the gateway"
  ip_protocol                  = "tcp"
  from_port                    = local.redis_port
  to_port                      = local.redis_port
  referenced_security_group_id = each.value
}

resource "aws_elasticache_replication_group" "redis" {
  replication_group_id = "${var.name}-redis"
  description          = "${var.name}: gateway state (keys, quotas, cache)"

  engine               = "redis"
  engine_version       = var.redis_engine_version
  parameter_group_name = var.redis_parameter_group_name
  node_type            = var.redis_node_type
  port                 = local.redis_port
  num_cache_clusters   = var.redis_num_cache_clusters

  automatic_failover_enabled = true
  multi_az_enabled           = true

  subnet_group_name  = aws_elasticache_subnet_group.redis.name
  security_group_ids = [aws_security_group.redis.id]

  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = random_password.redis_auth_token.result
  auth_token_update_strategy = "ROTATE"
  at_rest_encryption_enabled = true
  kms_key_id                 = aws_kms_key.redis.arn

  snapshot_retention_limit   = var.redis_snapshot_retention_days
  auto_minor_version_upgrade = true
  apply_immediately          = false
}

resource "aws_kms_key" "redis" {
  description             = "${var.name}: Redis at rest and its Secrets Manager secret"
  enable_key_rotation     = true
  deletion_window_in_days = 30
}

# The URL the gateway needs (`state.url`), for the gateway-secrets Secret in Kubernetes:
# sync it with the External Secrets Operator, or copy it once (infra/README.md).
resource "aws_secretsmanager_secret" "redis_url" {
  name        = "${var.name}/redis-url"
  description = "${var.name}: rediss:// URL with the ElastiCache auth token"
  kms_key_id  = aws_kms_key.redis.arn
}

resource "aws_secretsmanager_secret_version" "redis_url" {
  secret_id     = aws_secretsmanager_secret.redis_url.id
  secret_string = local.redis_url
}

locals {
  redis_url = "rediss://:${random_password.redis_auth_token.result}@${aws_elasticache_replication_group.redis.primary_endpoint_address}:${local.redis_port}/0"
}
