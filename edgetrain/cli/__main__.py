from edgetrain.cli import main

main()
