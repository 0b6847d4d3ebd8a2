"""Training input: reading rows (`readers`), RL and eval problems with their references checked (`problems`,
`code_formats`), prompts (`prompts`), SFT tokenization, packing and batches (`sft`, `packing`, `batches`), and the
built-in synthetic tasks (`synthetic`, `synthetic_code`). Import from the modules; nothing here imports an engine,
a stage or a command. The data-preparation commands (``python -m klear.data ...``) live in :mod:`klear.prep`."""
