from fl_lightning.strategies.athena import AthenaFL
from fl_lightning.strategies.base import ClientResult, ClientTask, ServerContext, State, Strategy
from fl_lightning.strategies.fedavg import FedAvg
from fl_lightning.strategies.feddane import FedDANE
from fl_lightning.strategies.feddf import FedDF
from fl_lightning.strategies.fedkt import FedKT
from fl_lightning.strategies.fedova import FedOVA
from fl_lightning.strategies.fednova import FedNova
from fl_lightning.strategies.fimlbfgs import FedOVAFIMLBFGS, FIMLBFGS
from fl_lightning.strategies.fedprox import FedProx
from fl_lightning.strategies.scaffold import SCAFFOLD
from fl_lightning.strategies.voting import CloseSetVoting, FedOV

__all__ = ["AthenaFL", "ClientResult", "ClientTask", "CloseSetVoting", "FIMLBFGS", "FedAvg", "FedDANE", "FedDF", "FedKT", "FedNova", "FedOV",
           "FedOVA", "FedOVAFIMLBFGS", "FedProx", "SCAFFOLD", "ServerContext", "State", "Strategy"]
