"""Planning: a study spec becomes a list of fully resolved runs.

Why a separate, pure stage: a plan must be reproducible and inspectable before any compute
is spent (`qkstudy plan`), and a run's identity is a hash of what this stage resolves. So
nothing here starts Ray, touches MLflow or measures hardware; measured throughput comes in as
an argument (`plan(study, throughput=...)`).
"""
