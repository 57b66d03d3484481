output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr_block" {
  description = "IPv4 CIDR block of the VPC."
  value       = aws_vpc.this.cidr_block
}

output "availability_zones" {
  description = "Availability zones the subnets are in, in subnet order."
  value       = local.azs
}

output "private_subnet_ids" {
  description = "IDs of the private subnets (one per availability zone): where the EKS control plane ENIs and nodes go."
  value       = aws_subnet.private[*].id
}

output "public_subnet_ids" {
  description = "IDs of the public subnets (one per availability zone): NAT gateways and internet-facing load balancers."
  value       = aws_subnet.public[*].id
}

output "private_route_table_ids" {
  description = "IDs of the private route tables, for adding further gateway endpoints."
  value       = aws_route_table.private[*].id
}

output "nat_public_ips" {
  description = "Public IPs the cluster's outbound traffic comes from (to allow-list at external services)."
  value       = aws_eip.nat[*].public_ip
}

output "flow_log_group_name" {
  description = "CloudWatch log group receiving the VPC flow logs."
  value       = aws_cloudwatch_log_group.flow_logs.name
}
