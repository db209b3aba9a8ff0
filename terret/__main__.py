from terret._startup import main

main()
