from clusterd.main import main

main()
