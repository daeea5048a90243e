"""The headless commands (`phasechat ask`, `chats`, `endpoints`, `bench`, `compare`, `ablate`,
`doctor`), and the options and build facts they share with `cli/main.py`: none loads Textual."""
