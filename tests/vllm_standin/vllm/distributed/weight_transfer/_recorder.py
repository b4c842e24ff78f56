"""The trainer endpoint of the stand-in's weight transfer: records instead of broadcasting."""


class TrainerGroup:
    """What ``trainer_init`` returns: the init info it was given and every broadcast's tensors."""

    def __init__(self, init_info):
        self.init_info = dict(init_info)
        self.sent = []  # one list of (name, tensor copy) per broadcast, in order

    def broadcast(self, named_tensors):
        self.sent.append([(name, tensor.detach().clone()) for name, tensor in named_tensors])
