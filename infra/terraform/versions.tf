terraform {
  required_version = ">= 1.6.0, < 2.0.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.0"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.7"
    }
  }

  # State holds the Redis auth token: keep it in an encrypted remote backend with locking,
  # for example (fill in, then `terraform init`):
  #
  # backend "s3" {
  #   bucket       = "REPLACE_ME-terraform-state"
  #   key          = "inference-gateway/terraform.tfstate"
  #   region       = "us-east-1"
  #   encrypt      = true
  #   use_lockfile = true
  # }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge({ "app.kubernetes.io/part-of" = "inference-gateway" }, var.tags)
  }
}
