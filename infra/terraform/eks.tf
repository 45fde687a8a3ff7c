# The existing EKS cluster (created elsewhere, e.g. with terraform-aws-modules/eks), and a
# managed GPU node group for the model workers.
#
# GPU nodes carry the label `inference-gateway.io/gpu=true` (the workers' and the stager's
# nodeSelector) and the taint `nvidia.com/gpu=true:NoSchedule`, so that only pods that
# tolerate it (workers, the stager, the NVIDIA device plugin) land on them. The AMI is the
# EKS-optimized Amazon Linux 2023 NVIDIA image (drivers included); the NVIDIA device plugin
# must run in the cluster for `nvidia.com/gpu` to be schedulable.

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

data "aws_iam_openid_connect_provider" "cluster" {
  url = data.aws_eks_cluster.this.identity[0].oidc[0].issuer
}

locals {
  gpu_node_labels = {
    "inference-gateway.io/gpu" = "true"
  }
  gpu_node_taint = {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }
  # The hostPath of infra/k8s (worker and stager), owned by the image's user (10001).
  weights_host_path = "/var/lib/gateway-weights"
}

resource "aws_iam_role" "gpu_node" {
  name = "${var.name}-gpu-node"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_role_policy_attachment" "gpu_node" {
  for_each = toset([
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",
  ])

  role       = aws_iam_role.gpu_node.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/${each.value}"
}

resource "aws_launch_template" "gpu_node" {
  name_prefix = "${var.name}-gpu-"
  description = "${var.name}: GPU nodes with a fast root volume for staged weights"

  # Weights are staged onto the root volume: size and throughput matter for cold starts.
  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = var.gpu_node_disk_gib
      volume_type           = "gp3"
      throughput            = var.gpu_node_disk_throughput_mibps
      iops                  = var.gpu_node_disk_iops
      encrypted             = true
      delete_on_termination = true
    }
  }

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required"
    # Pods must not reach the node's instance role through IMDS: they use IRSA.
    http_put_response_hop_limit = 1
  }

  # Runs before the node joins: the weights directory exists and belongs to the image's user,
  # so the stager never needs root.
  user_data = base64encode(<<-EOT
    MIME-Version: 1.0
    Content-Type: multipart/mixed; boundary="BOUNDARY"

    --BOUNDARY
    Content-Type: text/x-shellscript; charset="us-ascii"

    #!/bin/bash
    set -euo pipefail
    install -d -o 10001 -g 10001 -m 0755 ${local.weights_host_path}

    --BOUNDARY--
  EOT
  )

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-gpu" }
  }
}

resource "aws_eks_node_group" "gpu" {
  cluster_name    = data.aws_eks_cluster.this.name
  node_group_name = "${var.name}-gpu"
  node_role_arn   = aws_iam_role.gpu_node.arn
  subnet_ids      = var.private_subnet_ids

  ami_type       = "AL2023_x86_64_NVIDIA"
  capacity_type  = var.gpu_capacity_type
  instance_types = var.gpu_instance_types

  launch_template {
    id      = aws_launch_template.gpu_node.id
    version = aws_launch_template.gpu_node.latest_version
  }

  scaling_config {
    min_size     = var.gpu_nodes_min
    desired_size = var.gpu_nodes_desired
    max_size     = var.gpu_nodes_max
  }

  update_config {
    max_unavailable = 1
  }

  labels = local.gpu_node_labels

  taint {
    key    = local.gpu_node_taint.key
    value  = local.gpu_node_taint.value
    effect = local.gpu_node_taint.effect
  }

  lifecycle {
    # The autoscaler owns the node count once the group exists.
    ignore_changes = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.gpu_node]
}

# EKS tags the group's Auto Scaling group for the cluster autoscaler's auto-discovery, but
# not with the node template: without these tags the autoscaler cannot tell that a group at
# zero nodes would offer a GPU, the label and the taint, and never scales it up from zero.
resource "aws_autoscaling_group_tag" "gpu_node_template" {
  for_each = {
    "k8s.io/cluster-autoscaler/node-template/label/inference-gateway.io/gpu" = "true"
    "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"           = "true:NoSchedule"
    "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"       = "1"
  }

  autoscaling_group_name = aws_eks_node_group.gpu.resources[0].autoscaling_groups[0].name

  tag {
    key                 = each.key
    value               = each.value
    propagate_at_launch = false
  }
}
