"""The broker's edges: what decodes a request, checks who may make it, calls the one broker service
(``broker.service``) and encodes its answer. ``rocketmq``: RocketMQ's remoting protocol for the
official clients and mqadmin (issue 25). (The HTTP API and the binary port of our SDK join them
here with issue 24.)"""
