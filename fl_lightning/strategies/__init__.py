"""Every strategy by its short name (``--algorithm FedOVA``): the algorithms live in
fl_lightning/algorithms/<paper>/, the Strategy base in fl_lightning/strategy.py."""

from fl_lightning.algorithms import (SCAFFOLD, AthenaFL, CloseSetVoting, FedAvg, FedDANE, FedDF, FedKT, FedNova, FedOV,
                                     FedOVA, FedOVAFIMLBFGS, FedProx, FIMLBFGS)
from fl_lightning.strategy import ClientResult, ClientTask, ServerContext, State, Strategy

__all__ = ["AthenaFL", "ClientResult", "ClientTask", "CloseSetVoting", "FIMLBFGS", "FedAvg", "FedDANE", "FedDF", "FedKT",
           "FedNova", "FedOV", "FedOVA", "FedOVAFIMLBFGS", "FedProx", "SCAFFOLD", "ServerContext", "State", "Strategy"]
