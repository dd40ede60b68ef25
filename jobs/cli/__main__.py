from eyrie.jobs.cli import main

main()
