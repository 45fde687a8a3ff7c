variable "region" {
  description = "AWS region of the EKS cluster and everything created here."
  type        = string
}

variable "name" {
  description = "Prefix of the names of created resources."
  type        = string
  default     = "inference-gateway"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.name))
    error_message = "Lowercase letters, digits and dashes, 3 to 32 characters."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}

# ---- the existing EKS cluster and its network ---------------------------------------------

variable "cluster_name" {
  description = "Name of the existing EKS cluster the gateway runs on (its OIDC provider must be registered in IAM for IRSA)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (at least two, in different availability zones) for ElastiCache and the GPU nodes."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) >= 2
    error_message = "Give at least two private subnets in different availability zones."
  }
}

variable "redis_client_security_group_ids" {
  description = "Security groups allowed to reach Redis on its port. Empty: the cluster security group of the EKS cluster (all its managed nodes and pods)."
  type        = list(string)
  default     = []
}

# ---- weights bucket -----------------------------------------------------------------------

variable "weights_bucket_name" {
  description = "Name of the S3 bucket for model weights. Null: \"<name>-weights-<account id>\"."
  type        = string
  default     = null
}

variable "weights_prefix" {
  description = "Key prefix under which weights live (one folder per model); the only part of the bucket the gateway may read."
  type        = string
  default     = "models/"

  validation {
    condition     = can(regex("^[A-Za-z0-9!_.*'()-][A-Za-z0-9!_.*'()/-]*/$", var.weights_prefix))
    error_message = "A non-empty key prefix ending with \"/\", without a leading \"/\"."
  }
}

variable "noncurrent_weights_retention_days" {
  description = "Days that overwritten or deleted weight versions are kept (versioning) before expiring."
  type        = number
  default     = 30
}

# ---- IRSA -------------------------------------------------------------------------------

variable "k8s_namespace" {
  description = "Namespace of the gateway in the cluster (infra/k8s uses inference-gateway)."
  type        = string
  default     = "inference-gateway"
}

variable "k8s_service_accounts" {
  description = "ServiceAccounts that may assume the weights-reader role: the stager/worker's."
  type        = list(string)
  default     = ["model-weights"]
}

variable "gateway_service_account" {
  description = "The gateway's ServiceAccount: the only one that may assume the gateway role (batch files)."
  type        = string
  default     = "gateway"
}

# ---- batch files bucket -----------------------------------------------------------------

variable "batch_files_bucket_name" {
  description = "Name of the S3 bucket for batch files (batches.files.bucket). Null: \"<name>-batch-files-<account id>\"."
  type        = string
  default     = null
}

variable "batch_files_prefix" {
  description = "Key prefix of batch files (batches.files.prefix); the only part of the bucket the gateway may touch."
  type        = string
  default     = "batch-files/"

  validation {
    condition     = can(regex("^[A-Za-z0-9!_.*'()-][A-Za-z0-9!_.*'()/-]*/$", var.batch_files_prefix))
    error_message = "A non-empty key prefix ending with \"/\", without a leading \"/\"."
  }
}

# ---- Redis (ElastiCache) ----------------------------------------------------------------

variable "redis_node_type" {
  description = "ElastiCache node type."
  type        = string
  default     = "cache.r7g.large"
}

variable "redis_engine_version" {
  description = "Redis OSS engine version."
  type        = string
  default     = "7.1"
}

variable "redis_parameter_group_name" {
  description = "Parameter group; must match the engine version's family."
  type        = string
  default     = "default.redis7"
}

variable "redis_num_cache_clusters" {
  description = "Nodes in the replication group: one primary and the rest replicas (2 or more for automatic failover)."
  type        = number
  default     = 2

  validation {
    condition     = var.redis_num_cache_clusters >= 2 && var.redis_num_cache_clusters <= 6
    error_message = "Between 2 (primary and one replica, for failover) and 6."
  }
}

variable "redis_snapshot_retention_days" {
  description = "Days of automatic snapshots (keys and quota counters live in Redis). 0 disables them."
  type        = number
  default     = 7
}

# ---- GPU node group -----------------------------------------------------------------------

variable "gpu_instance_types" {
  description = "Instance types of the GPU node group (one NVIDIA GPU per worker pod)."
  type        = list(string)
  default     = ["g5.2xlarge"]
}

variable "gpu_capacity_type" {
  description = "ON_DEMAND or SPOT."
  type        = string
  default     = "ON_DEMAND"

  validation {
    condition     = contains(["ON_DEMAND", "SPOT"], var.gpu_capacity_type)
    error_message = "ON_DEMAND or SPOT."
  }
}

variable "gpu_nodes_min" {
  description = "Minimum GPU nodes. 0 lets the cluster autoscaler remove every GPU node when all models are scaled to zero, at the price of node start-up (minutes) in the next cold start, and of re-staging weights on the new node."
  type        = number
  default     = 1
}

variable "gpu_nodes_desired" {
  description = "GPU nodes at creation; the cluster autoscaler (or Karpenter) manages the count afterwards."
  type        = number
  default     = 1
}

variable "gpu_nodes_max" {
  description = "Maximum GPU nodes."
  type        = number
  default     = 4
}

variable "gpu_node_disk_gib" {
  description = "Root volume of GPU nodes (gp3): images plus staged weights under /var/lib/gateway-weights."
  type        = number
  default     = 400
}

variable "gpu_node_disk_throughput_mibps" {
  description = "gp3 throughput of the GPU nodes' root volume, in MiB/s (125 to 1000): bounds how fast a cold start reads weights that are not in the page cache."
  type        = number
  default     = 1000
}

variable "gpu_node_disk_iops" {
  description = "gp3 IOPS of the GPU nodes' root volume (3000 to 16000)."
  type        = number
  default     = 8000
}
