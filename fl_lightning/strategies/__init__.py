from fl_lightning.strategies.base import ClientResult, ClientTask, State, Strategy
from fl_lightning.strategies.fedavg import FedAvg
from fl_lightning.strategies.fedova import FedOVA

__all__ = ["ClientResult", "ClientTask", "FedAvg", "FedOVA", "State", "Strategy"]
