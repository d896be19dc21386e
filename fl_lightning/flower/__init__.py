"""fl_lightning on Flower's Deployment Runtime (flwr 1.42, Message API, gRPC): the same
federated loop, strategies and client training, with each client a Flower ``ClientApp`` on
its own SuperNode holding only its own partition (docs/flower.md)."""
