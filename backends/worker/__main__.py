from backends.worker.server import main

main()
