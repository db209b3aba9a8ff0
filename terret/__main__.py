from terret.cli import main

main()
