from sluice_worker import main

main()
