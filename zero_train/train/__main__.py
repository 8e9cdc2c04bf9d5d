"""`python -m zero_train.train`: one training run (zero_train.train.main)."""

from zero_train.train.main import main

main()
