"""Seed prompts for the verifier's synthetic pairs, written for this project.

Each seed is edited by scripts/synthetic_pairs.py into positives (harmless edits) and
negatives (one-word contrasts, direction swaps, changed numbers, dropped constraints).
"""

from __future__ import annotations

SEEDS = """
How do I read a CSV file line by line in Python?
Write a Python function that sorts a list of tuples by the second element in ascending order.
Convert a Python list to a tuple
How do I convert a string to an integer in Go?
Convert 25 degrees Celsius to Fahrenheit
Convert 12 km to miles
How many ounces are in 3 pounds?
What is 15% of 240?
Find the maximum value in a column in Excel
Excel formula to count the cells in column B that are not empty
SQL query to select the top 5 customers by total order value
How do I delete a remote branch in git?
How do I undo the last commit in git but keep the changes?
git: rename the current local branch
Docker: copy a folder from the container to the host
Kubernetes: scale a deployment to 3 replicas
How do I make a Python script executable on Linux?
Bash: loop over all .txt files in a folder and print their names
Regex to match an email address
Regex that matches a US phone number with optional dashes
JavaScript: remove duplicates from an array
TypeScript: make all properties of an interface optional
Rust: convert a Vec of strings into a HashMap of counts
How do I read a JSON file into a pandas DataFrame?
pandas: group by a column and compute the mean of another column
pandas: fill missing values with the median of each column
Convert this JSON to YAML: {"name": "web", "port": 8080}
Convert this CSV to a Markdown table: name,age Ana,31 Ben,27
Write a SQL query that joins orders to customers and returns customers with no orders
What is the difference between a process and a thread?
Explain the difference between TCP and UDP in simple terms
How does public key encryption work?
What is the capital of Australia?
When did the Berlin Wall fall?
Why is the sky blue?
How far is the Moon from the Earth?
What is the boiling point of water at high altitude?
Who wrote Pride and Prejudice?
How do I reset my password if I no longer have access to my email?
How do I cancel my subscription before the next billing date?
Can I upgrade from the Basic plan to the Pro plan in the middle of the month?
How do I export all my invoices as a PDF?
How do I add a new member to my team with editor access?
Why was I charged twice this month?
How do I turn on two-factor authentication for my account?
My API key stopped working after I rotated it. What should I do?
What is the rate limit for the free tier of your API?
How do I download my data before deleting my account?
Write a polite email to my manager asking for Friday off
Write a short thank-you note to a client after a first meeting
Write a formal complaint letter to an airline about lost luggage
Translate 'Where is the train station?' into French
Translate this sentence into informal German: 'See you tomorrow at the cafe.'
Summarize in two sentences: 'The library opened in March after three years of building work.'
Rewrite this sentence in the passive voice: 'The committee approved the budget on Monday.'
Give me 10 names for a bakery that sells sourdough bread
Write a haiku about autumn rain
Write a LinkedIn post announcing that our team is hiring a backend engineer
Write a product description for a stainless steel water bottle in under 80 words
How many calories are in a cup of cooked rice?
Give me a 3-day workout plan for beginners with no equipment
How long should I boil an egg for a soft yolk?
What is a good bedtime routine for a 2-year-old?
How much should I save each month to retire at 60?
Plan a 5-day trip to Lisbon in May for two people on a budget
What should I pack for a beach vacation in July?
How do I remove a red wine stain from a white carpet?
How do I unclog a kitchen sink without chemicals?
How do I change a flat tire on a bike?
How do I connect my printer to Wi-Fi on Windows 11?
How do I take a screenshot on a Mac?
How do I back up my iPhone to my computer?
A train travels 300 km in 2.5 hours. What is its average speed?
If I invest $5,000 at 4% annual interest, how much will I have after 10 years?
Solve for x: 3x + 7 = 22
What is the derivative of x^3 + 2x?
Round 3.14159 to two decimal places
What is the square root of 144?
Write a Python function that returns the largest of three numbers
Sort this list in descending order: 8, 3, 15, 1, 9
Create a weekly meal plan for a family of four, vegetarian, as a table
Explain photosynthesis to a 10-year-old in three sentences
Explain how vaccines work to a nurse in under 150 words
Write a cover letter for a junior data analyst role, formal tone, one page
Summarize the causes of World War I in five bullet points
Give me a bash one-liner that counts the lines in all .py files in this folder
Write a Go program that reads a file and prints the number of words
Write an HTTP server in Rust that returns hello world on port 8080
Give me a SQL query to find the second highest salary in an employees table
How do I create an index on the email column in PostgreSQL?
How do I back up a MySQL database to a file?
Explain the difference between INNER JOIN and LEFT JOIN
In React, how do I pass a function from a parent component to a child component?
How do I center a div horizontally with CSS?
How do I make an HTTP GET request in JavaScript with fetch?
How do I read environment variables in Node.js?
How do I upload a file to an S3 bucket with the AWS CLI?
How do I move files from my laptop to an external drive faster?
What time is it in Tokyo when it is 9 am in London?
How do I convert a Word document to PDF on Windows?
Excel: convert text to uppercase in column A
Google Sheets: sum the values in column C where column A is 'paid'
Excel formula to calculate the number of days between two dates
How do I remove the first character of a string in Excel?
Convert this XML to JSON: <user><name>Lee</name><age>40</age></user>
Parse a date string like '2023-07-01' into a datetime object in Python
Format a number with thousands separators in JavaScript
How do I encrypt a file with a password on Linux?
How do I compress a folder into a zip file on macOS?
How do I merge two dictionaries in Python?
What is the time complexity of inserting into a hash map?
Explain what a closure is in JavaScript with a short example
How do I check which version of Python is installed?
How do I install Node.js on Ubuntu?
How do I stop a running Docker container?
How do I list all pods in a Kubernetes namespace?
Write a unit test in pytest for a function that adds two numbers
How do I handle errors in async functions in JavaScript?
What are the pros of remote work for small companies?
Give me three arguments for a four-day work week
Write a funny birthday message for my sister who is turning 30
Write a welcome email for new customers who signed up for the free trial
Suggest five questions to ask at the end of a job interview
How do I tell my landlord that I am moving out at the end of the month?
Is it safe to eat eggs after the expiration date?
Can I freeze cooked pasta?
What is a healthy breakfast for weight loss?
How many hours of sleep does a teenager need?
What are the symptoms of dehydration in adults?
What is the best time to visit Japan for cherry blossoms?
How do I get from the airport to the city center in Madrid?
What is the tallest mountain in Europe?
How many bones are in the adult human body?
What is the speed of light in a vacuum?
Who painted the ceiling of the Sistine Chapel?
Why did the dinosaurs go extinct?
Explain inflation to a high school student using an example with pizza prices
Draft a reply to a customer who wants a refund after 45 days, our policy allows 30 days
Write a short poem for my grandmother's 80th birthday, warm and simple
Give me a one-week study plan to learn basic SQL, one hour per day
Write a tweet announcing that our app now works offline
Write release notes for version 3.1: faster search, fixed crash on startup. Under 50 words.
Compare Python and Java for a beginner who wants to build web apps, in a table
Create a packing list for a 3-day camping trip in the mountains in October
Write a job ad for a part-time barista, friendly tone, under 100 words
Convert 1,500 meters to feet
Convert 8 PM Eastern time to Central European time
How many tablespoons are in half a cup?
Double this recipe: 2 cups flour, 1 cup sugar, 3 eggs
What is 2 to the power of 10?
Is 97 a prime number?
Calculate the area of a circle with a radius of 4 cm
How do I enable dark mode in the mobile app?
How do I change the email address on my account?
Can I pay with PayPal instead of a credit card?
How do I transfer ownership of a workspace to another admin?
How do I import contacts from a CSV file?
How do I set up a webhook for new orders?
"""

SEED_PROMPTS = [line.strip() for line in SEEDS.strip().splitlines() if line.strip()]
