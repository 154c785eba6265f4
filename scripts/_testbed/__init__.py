"""The test beds behind scripts/testbed: local sshd "hosts" (hosts.py) and an EC2 API with real
machines behind it in a network namespace (ec2/). cli.py parses the command line for both.

The hosts bed and everything the EC2 command line runs outside its controller use the standard
library only; the EC2 controller (ec2/controller.py and what it imports) needs moto and boto3.
"""
